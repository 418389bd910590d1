"""The batch-job engine: job policies (``fifo``, ``sjf``, ``srtf``, ``tiresias``, ``qssf``, ``ces``
and plug-ins of kind ``job``) on a fixed cluster; ``job_sharing`` and ``job_leases`` extend it for
policies that pack two jobs on a GPU (tensorshare, lucid) or lease GPUs (themis).

Semantics (docs/simulator.md has the full list):
- Events at the same instant are applied together (completions, then demotions, then arrivals),
  and then the queue is scheduled once.
- Non-preemptive policies start waiting jobs in the policy's order; without backfill the first job
  that cannot start blocks the rest (strict FIFO); with backfill later jobs that fit may start.
- Preemptive policies recompute the running set at every scheduling point: all active jobs in the
  policy's order, each taken when its GPUs still fit in the cluster's total; running jobs left out
  are preempted (progress kept, plus ``preemption_overhead_s``) and chosen waiting jobs start.
- ``pooled``: a job's GPUs come from the hosts with the most idle GPUs; ``consolidated``: a job
  that fits on one host starts only on one host (best fit), bigger jobs are pooled;
  ``sensitive``: only a job whose model a spread slows (``job_placement.is_sensitive``) waits
  for one host, as Tiresias consolidates; the others are pooled.
- ``placement_slowdown = "model"`` (``job_placement``): a job whose GPUs span hosts progresses at
  1 / its model's cross-host factor for as long as it runs there, and pooled placement takes one
  host (best fit) when one has room before it spreads a job.
- Hooks a policy may implement: ``job_finished`` (learn from a completed job),
  ``waiting_priority_change`` (a waiting job's key changes at a known time: aging), and a power
  manager (``ces``: hosts put to sleep and woken; ``job_power``).
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from notebookos.cluster import Cluster, Host
from notebookos.policies import placement
from notebookos.policies.base import Policy, QueuedJob
from notebookos.resources import ResourceSpec
from notebookos.simulator.config import SimConfig
from notebookos.simulator.hosts import HostFactory
from notebookos.simulator.job_placement import cross_host_factor, is_sensitive
from notebookos.simulator.records import RunRecord, TaskRecord
from notebookos.workload.model import Workload

COMPLETE, DEMOTE, ARRIVE, AGE, TICK = 0, 1, 2, 3, 4


@dataclass(slots=True)
class _Job:
    q: QueuedJob
    rec: TaskRecord
    running: bool = False
    since: float = 0.0  # when q.remaining / q.attained_gpu_s were last brought up to date
    hosts: list[Host] = field(default_factory=list)
    version: int = 0
    speed: float = 1.0  # progress per second (< 1 while sharing a GPU)
    wait_version: int = 0  # bumped when a waiting job's queue entry is re-keyed (aging)
    key: tuple = ()  # its key in the wait queue while it waits
    counts: list[int] = field(default_factory=list)  # GPUs on each of ``hosts``


class JobSimulator:
    def __init__(self, workload: Workload, policy: Policy, config: SimConfig,
                 progress: Callable[[float], None] | None = None) -> None:
        self.policy = policy
        self.config = config
        self.progress = progress
        self.cluster = Cluster(replicas_per_kernel=1)
        factory = HostFactory(self.cluster, config.gpus_per_host, 1.0, gpus_only=True)
        for _ in range(self.hosts_in_main_pool(policy, config)):
            factory.new_host()
        self.record = RunRecord(policy.name)
        self.jobs: list[_Job] = []
        for seq, task in enumerate(workload.tasks):
            q = QueuedJob(task.task_id, task.submit, task.gpus, task.duration, task.duration, 0.0,
                          seq, task.name, task.user)
            self.jobs.append(_Job(q, TaskRecord(task.task_id, task.session_id, task.gpus,
                                                task.submit, task.duration)))
        self.record.tasks = [j.rec for j in self.jobs]
        self.waiting: list[tuple[tuple, int]] = []  # sorted (key, seq)
        self.running: dict[int, _Job] = {}
        self.events: list[tuple[float, int, int, int]] = [
            (j.q.submit_time, ARRIVE, j.q.seq, 0) for j in self.jobs]
        heapq.heapify(self.events)
        span = max((j.q.submit_time + j.q.duration for j in self.jobs), default=0.0)
        self.sample_every = max(1.0, span / config.timeline_points)
        self.next_sample = 0.0
        self.finished = 0
        self.preemptions = 0  # cumulative; the timeline's "migrations" column for job runs
        self.gpus_per_host = config.gpus_per_host
        self.factory = factory
        self.power = None
        if getattr(policy, "sleeps_hosts", False):
            from notebookos.simulator.job_power import HostPower

            self.power = HostPower(self)
        self._finished_hook = getattr(policy, "job_finished", None)
        # Finish-time fairness (Themis): the integral of active jobs (waiting + running) over time.
        self._active = 0
        self._active_integral = 0.0
        self._active_since = 0.0
        self._integral_at_submit: dict[int, float] = {}
        self.rho: list[float] = []
        self._user_rho: dict[str, tuple[float, float]] = {}  # user -> (sum JCT, sum N_avg x d)
        self._aging = getattr(policy, "waiting_priority_change", None)
        # Placement sensitivity (job_placement): each job's cross-host factor, or None when off.
        self.spread_factor: list[float] | None = None
        if config.placement_slowdown == "model":
            self.spread_factor = [cross_host_factor(j.q.name) for j in self.jobs]
        self.spread_starts = 0  # jobs started (or restarted) over more than one host

    keeps_timers = False  # an extension whose timers outlive the jobs sets this

    @staticmethod
    def hosts_in_main_pool(policy: Policy, config: SimConfig) -> int:
        """Hosts that run jobs (an extension may set some aside, e.g. a profiling pool)."""
        return config.hosts

    # -- bookkeeping --------------------------------------------------------------------------

    def _sync(self, job: _Job, now: float) -> None:
        if job.running and now > job.since:
            elapsed = now - job.since
            job.q.remaining = max(0.0, job.q.remaining - elapsed * job.speed)
            job.q.attained_gpu_s += elapsed * job.q.num_gpus
        job.since = now

    def _key(self, job: _Job, now: float) -> tuple:
        return self.policy.priority_key(job.q, now)

    def _enqueue(self, job: _Job, now: float) -> None:
        job.key = self._key(job, now)
        bisect.insort(self.waiting, (job.key, job.q.seq))
        if self._aging is not None:
            change = self._aging(job.q, now)
            if change is not None:
                job.wait_version += 1
                heapq.heappush(self.events, (change, AGE, job.q.seq, job.wait_version))

    def _rekey(self, job: _Job, now: float) -> None:
        """A waiting job's key changed (aging): move its queue entry."""
        entry = (job.key, job.q.seq)
        index = bisect.bisect_left(self.waiting, entry)
        if index < len(self.waiting) and self.waiting[index] == entry:
            del self.waiting[index]
            self._enqueue(job, now)

    def _commit_change(self, now: float) -> None:
        self.record.integrals.advance(now)
        self.record.integrals.committed_gpus = self.cluster.committed_gpus

    def _sample(self, now: float) -> None:
        while self.next_sample <= now:
            t = self.next_sample
            running = len(self.running)
            self.record.timeline.append((
                round(t, 3), running + len(self.waiting), running, len(self.waiting),
                len(self.cluster.hosts), self.cluster.total_gpus, self.cluster.committed_gpus,
                0.0, self.preemptions, self.cluster.committed_gpus, ""))
            self.next_sample += self.sample_every

    # -- placement ----------------------------------------------------------------------------

    def _place(self, job: _Job) -> list[tuple[Host, int]] | None:
        need = job.q.num_gpus
        if need > self.cluster.total_gpus - self.cluster.committed_gpus:
            return None
        mode = self.config.placement
        if need <= self.config.gpus_per_host and (
                mode == "consolidated" or self.spread_factor is not None
                or (mode == "sensitive" and is_sensitive(job.q.name))):
            for host in placement.fewest_idle_first(self.cluster, min_idle=need, limit=1):
                return [(host, need)]
            if mode == "consolidated" or (mode == "sensitive" and is_sensitive(job.q.name)):
                return None
        return self._spread(need)

    def _spread(self, need: int) -> list[tuple[Host, int]] | None:
        """``need`` GPUs taken from the hosts with the most idle first; None if they lack it."""
        picks = []
        for host in placement.most_idle_first(self.cluster, min_idle=1):
            take = min(need, host.idle_gpus)
            picks.append((host, take))
            need -= take
            if need == 0:
                return picks
        return None

    def _start(self, job: _Job, picks: list[tuple[Host, int]], now: float) -> None:
        self._commit_change(now)
        owner = job.q.job_id
        for host, k in picks:
            host.commit(owner, ResourceSpec(gpus=k))
        job.hosts = [h for h, _ in picks]
        job.counts = [k for _, k in picks]
        if self.spread_factor is not None:
            spread = len(picks) > 1
            job.speed = 1.0 / self.spread_factor[job.q.seq] if spread else 1.0
            self.spread_starts += spread
        job.running = True
        job.since = now
        job.version += 1
        self.running[job.q.seq] = job
        self.record.integrals.committed_gpus = self.cluster.committed_gpus
        if job.rec.start is None:
            job.rec.start = job.rec.bound = now
            job.rec.host = "+".join(h.host_id for h in job.hosts)
        end = now + job.q.remaining / job.speed
        heapq.heappush(self.events, (end, COMPLETE, job.q.seq, job.version))
        change = self.policy.next_priority_change(job.q, now)
        if change is not None and change < end:
            heapq.heappush(self.events, (change, DEMOTE, job.q.seq, job.version))

    def _stop(self, job: _Job, now: float) -> None:
        self._sync(job, now)
        self._commit_change(now)
        for host in job.hosts:
            host.release(job.q.job_id)
        job.hosts = []
        job.counts = []
        job.running = False
        job.version += 1
        del self.running[job.q.seq]
        self.record.integrals.committed_gpus = self.cluster.committed_gpus

    # -- scheduling -----------------------------------------------------------------------------

    def _schedule(self, now: float) -> None:
        if not self.waiting:
            return
        if self.policy.preemptive:
            self._schedule_preemptive(now)
        else:
            self._schedule_in_order(now)

    def _schedule_in_order(self, now: float) -> None:
        free = self.cluster.total_gpus - self.cluster.committed_gpus
        i = 0
        while i < len(self.waiting) and free > 0:
            job = self.jobs[self.waiting[i][1]]
            if job.q.num_gpus <= free:
                picks = self._place(job)
                if picks is not None:
                    del self.waiting[i]
                    self._start(job, picks, now)
                    free -= job.q.num_gpus
                    continue
            if not self.policy.backfill:
                return
            i += 1

    def _schedule_preemptive(self, now: float) -> None:
        for job in self.running.values():
            self._sync(job, now)
        keys = [(self._key(j, now), j.q.seq) for j in self.running.values()]
        if not keys or self.waiting[0] > max(keys):
            # Nobody waiting outranks a running job: the running set stays and free GPUs go to
            # waiting jobs in order, which is what the full recomputation below would decide.
            self._schedule_in_order(now)
            return
        running = sorted(keys)
        free = self.cluster.total_gpus
        keep: set[int] = set()
        chosen: list[tuple[tuple, int]] = []
        for entry in heapq.merge(running, self.waiting):
            job = self.jobs[entry[1]]
            if job.q.num_gpus <= free:
                free -= job.q.num_gpus
                if job.running:
                    keep.add(job.q.seq)
                else:
                    chosen.append(entry)
                if free == 0:
                    break
        if not chosen:
            return
        for seq in [s for s in self.running if s not in keep]:
            job = self.jobs[seq]
            self._stop(job, now)
            job.rec.preemptions += 1
            self.preemptions += 1
            job.q.remaining += self.config.preemption_overhead_s
            self._enqueue(job, now)
        for entry in chosen:
            job = self.jobs[entry[1]]
            picks = self._place(job)
            if picks is None:
                continue
            del self.waiting[bisect.bisect_left(self.waiting, entry)]
            self._start(job, picks, now)

    # -- the loop ---------------------------------------------------------------------------------

    def _count_active(self, now: float, change: int) -> None:
        self._active_integral += self._active * (now - self._active_since)
        self._active_since = now
        self._active += change

    def _finish_time_fairness(self, job: _Job, now: float) -> None:
        """rho = JCT / (N_avg x duration), N_avg = the mean number of active jobs over the job's
        life (Themis's T_shared / T_independent for a rigid job, eq. 1)."""
        self._count_active(now, -1)
        start = self._integral_at_submit.pop(job.q.seq, None)
        jct = now - job.q.submit_time
        if start is None or job.q.duration <= 0 or jct <= 0:
            return
        n_avg = max(1.0, (self._active_integral - start) / jct)
        self.rho.append(jct / (n_avg * job.q.duration))
        if job.q.user:
            wall, ideal = self._user_rho.get(job.q.user, (0.0, 0.0))
            self._user_rho[job.q.user] = (wall + jct, ideal + n_avg * job.q.duration)

    def _complete(self, job: _Job, now: float) -> None:
        self._stop(job, now)
        job.rec.end = now
        self.finished += 1
        self._finish_time_fairness(job, now)
        if self._finished_hook is not None:
            self._finished_hook(job.q, now)

    def _on_tick(self, code: int, now: float) -> None:
        """A timer of an extension (``code`` says which); the base engine has the power manager's."""
        if self.power is not None:
            self.power.on_tick(code, now)

    def _arrive(self, job: _Job, now: float) -> None:
        if job.q.num_gpus > self.max_job_gpus():
            self.record.unschedulable.append(job.q.job_id)
            self.finished += 1
            return
        job.since = now
        self._count_active(now, 1)
        self._integral_at_submit[job.q.seq] = self._active_integral
        self._enqueue(job, now)

    def max_job_gpus(self) -> int:
        """The largest job the cluster could ever run (sleeping hosts count: they can wake)."""
        return self.cluster.total_gpus + (self.power.asleep_gpus() if self.power else 0)

    def _handle(self, kind: int, seq: int, version: int, now: float) -> None:
        if kind == TICK:
            self._on_tick(version, now)
            return
        job = self.jobs[seq]
        if kind == ARRIVE:
            self._arrive(job, now)
        elif kind == AGE:
            if version == job.wait_version and not job.running and job.rec.end is None:
                self._rekey(job, now)
        elif version != job.version or not job.running:
            return
        elif kind == COMPLETE:
            self._complete(job, now)
        else:  # DEMOTE: the job's key changed; look again at the queue
            self._sync(job, now)
            change = self.policy.next_priority_change(job.q, now)
            if change is not None and change < now + job.q.remaining:
                heapq.heappush(self.events, (change, DEMOTE, seq, job.version))

    def host_count(self) -> int:
        """Hosts the provider pays for (an extension's own pool counts too)."""
        return len(self.cluster.hosts)

    def run(self) -> RunRecord:
        wall = time.perf_counter()
        self.record.integrals.hosts = self.host_count()
        if self.power is not None:
            self.power.start()
        total = len(self.jobs)
        processed = 0
        events = self.events
        while events:
            now = events[0][0]
            self._sample(now)
            while events and events[0][0] == now:
                _, kind, seq, version = heapq.heappop(events)
                self._handle(kind, seq, version, now)
            self._schedule(now)
            if self.power is not None:
                self.power.after_schedule(now)
            processed += 1
            if self.progress is not None and processed % 512 == 0:
                self.progress(self.finished / max(1, total))
            if self.finished >= total and (self.power is not None or self._aging is not None
                                           or self.keeps_timers):
                break  # only timers (power checks, aging, leases) are left
        end = max((j.rec.end for j in self.jobs if j.rec.end is not None), default=0.0)
        self.record.integrals.advance(end)
        self.record.end_time = end
        if self.power is not None:
            self.power.finish(end)
        if self.rho:
            values = np.asarray(self.rho)
            self.record.extra["max_finish_time_fairness"] = round(float(values.max()), 4)
            for q in (50, 90, 99):
                self.record.extra[f"finish_time_fairness_p{q}"] = round(
                    float(np.percentile(values, q)), 4)
            self.record.extra["finish_time_fairness_over_1"] = round(
                float((values > 1.0).mean()), 6)
        if self.spread_factor is not None:
            self.record.extra["spread_starts"] = self.spread_starts
        if self._user_rho:
            per_user = [wall / ideal for wall, ideal in self._user_rho.values() if ideal > 0]
            if per_user:
                self.record.extra["max_user_finish_time_fairness"] = round(max(per_user), 4)
        self.record.wall_s = time.perf_counter() - wall
        if self.progress is not None:
            self.progress(1.0)
        return self.record
