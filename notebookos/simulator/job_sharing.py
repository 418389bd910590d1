"""The job engine for policies that put two jobs on one set of GPUs (``tensorshare``, ``lucid``).

A job that *joins* another runs on that job's GPUs (no GPU is committed twice); both progress at
1/delta of their dedicated speed, delta from ``notebookos.workload.interference.slowdown`` (the
simulator's ground truth, which the policies only predict). When one ends, the other runs alone
again at full speed (and owns the GPUs). At most two jobs share a GPU set, and only jobs with the
same GPU count (both seeds' rule). The policy decides through two optional extension points:

- ``partner_among_running(job, running_alone, now)`` (Lucid's Binder: a queued job joins a running
  job that runs alone), tried for each waiting job before it is placed alone;
- ``partner_from_queue(job, waiting, now)`` (TensorShare: the job about to start, or a running job
  whose partner just ended, picks a queued partner), used while the queue asks for more GPUs than
  are free.

A policy with ``profile_s > 0`` (Lucid) also gets a profiling pool: ``profile_hosts`` hosts taken
from the cluster where jobs of at most ``profile_max_gpus`` GPUs first run alone, least GPUs
first, for up to ``profile_s``; a job that ends there is done, the others go to the main queue with
their profile known and start over (a non-intrusive profiler cannot checkpoint them). A job that
has waited longer than ``profile_s`` for the profiler skips it (the time-aware rule, simplified).

Extra figures: ``shared_jobs`` (jobs that shared at some point) and, for a policy with a GPU SLA
(``gsla``), ``gsla_violation_fraction`` (over jobs that shared: realised delta = run time / solo
duration above the job's SLA; ``gsla_violation_fraction_all_jobs`` over all finished jobs, the
paper's denominator) and ``excess_ratio_p50/p90/p99`` over the violators
(100 x (delta - SLA) / SLA), as TensorShare reports them; for a profiling pool, ``profiled_jobs``
and ``finished_in_profiling``.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from notebookos.cluster import Cluster
from notebookos.policies import placement
from notebookos.policies.base import Policy
from notebookos.resources import ResourceSpec
from notebookos.simulator.config import SimConfig
from notebookos.simulator.hosts import HostFactory
from notebookos.simulator.jobsim import COMPLETE, TICK, JobSimulator, _Job
from notebookos.workload.interference import slowdown
from notebookos.workload.model import Workload

PROFILE_END = 5  # an event kind of this engine


class SharingJobSimulator(JobSimulator):
    def __init__(self, workload: Workload, policy: Policy, config: SimConfig,
                 progress=None) -> None:  # noqa: ANN001
        super().__init__(workload, policy, config, progress)
        self.partner: dict[int, int] = {}
        self.alone: dict[int, dict[int, None]] = {}  # GPUs -> running seqs alone (start order)
        self.freed: list[int] = []  # running jobs whose partner just ended
        self.alone_version: dict[int, int] = {}  # GPUs -> bumped when that set of jobs changes
        self.asked: dict[int, int] = {}  # waiting seq -> alone_version when last turned down
        self.shared: set[int] = set()
        self.main_start: dict[int, float] = {}  # seq -> when it started in the main cluster
        self.joins = bool(getattr(policy, "partner_among_running", None))
        self.pairs = bool(getattr(policy, "partner_from_queue", None))
        self.profile_s = float(getattr(policy, "profile_s", 0.0) or 0.0)
        self.prof_queue: list[tuple[int, int]] = []  # (GPUs, seq): least GPUs first
        self.profiled = 0
        self.profile_done = 0
        self.skipped_profiling = 0
        if self.profile_s > 0:
            self.prof_cluster = Cluster(replicas_per_kernel=1)
            factory = HostFactory(self.prof_cluster, config.gpus_per_host, 1.0, gpus_only=True)
            factory.next_index = 90_000  # host ids distinct from the main pool's
            for _ in range(self.profile_hosts(policy, config)):
                factory.new_host()
            self.prof_max = min(int(policy.profile_max_gpus), self.prof_cluster.total_gpus)

    @staticmethod
    def profile_hosts(policy: Policy, config: SimConfig) -> int:
        if float(getattr(policy, "profile_s", 0.0) or 0.0) <= 0:
            return 0
        return max(0, min(int(policy.profile_hosts), config.hosts - 1))

    @staticmethod
    def hosts_in_main_pool(policy: Policy, config: SimConfig) -> int:
        return config.hosts - SharingJobSimulator.profile_hosts(policy, config)

    # -- books: the profiling pool counts too -------------------------------------------------

    def _commit_change(self, now: float) -> None:
        self.record.integrals.advance(now)
        self.record.integrals.committed_gpus = self._committed()

    def _committed(self) -> int:
        extra = self.prof_cluster.committed_gpus if self.profile_s > 0 else 0
        return self.cluster.committed_gpus + extra

    def host_count(self) -> int:
        extra = len(self.prof_cluster.hosts) if self.profile_s > 0 else 0
        return len(self.cluster.hosts) + extra

    def run(self):  # noqa: ANN201
        record = super().run()
        self._report()
        return record

    # -- starting, joining, ending ------------------------------------------------------------

    def _start(self, job: _Job, picks, now: float) -> None:  # noqa: ANN001
        super()._start(job, picks, now)
        self.record.integrals.committed_gpus = self._committed()
        self.main_start.setdefault(job.q.seq, now)
        self._set_alone(job.q.num_gpus, job.q.seq, True)

    def _set_alone(self, gpus: int, seq: int, alone: bool) -> None:
        bucket = self.alone.setdefault(gpus, {})
        if alone:
            bucket[seq] = None
        else:
            bucket.pop(seq, None)
        self.alone_version[gpus] = self.alone_version.get(gpus, 0) + 1

    def _reschedule(self, job: _Job, now: float) -> None:
        job.version += 1
        heapq.heappush(self.events, (now + job.q.remaining / job.speed, COMPLETE, job.q.seq,
                                     job.version))

    def _join(self, job: _Job, anchor: _Job, now: float) -> None:
        """``job`` starts on ``anchor``'s GPUs; both slow down."""
        self._sync(anchor, now)
        self._set_alone(anchor.q.num_gpus, anchor.q.seq, False)
        anchor.speed = 1.0 / slowdown(anchor.q.name, job.q.name)
        self._reschedule(anchor, now)
        job.speed = 1.0 / slowdown(job.q.name, anchor.q.name)
        job.hosts = []
        job.running = True
        job.since = now
        self.running[job.q.seq] = job
        self.partner[job.q.seq] = anchor.q.seq
        self.partner[anchor.q.seq] = job.q.seq
        self.shared.update((job.q.seq, anchor.q.seq))
        if job.rec.start is None:
            job.rec.start = job.rec.bound = now
        job.rec.host = anchor.rec.host
        self.main_start.setdefault(job.q.seq, now)
        self._reschedule(job, now)

    def _complete(self, job: _Job, now: float) -> None:
        seq = job.q.seq
        other_seq = self.partner.pop(seq, None)
        if other_seq is None:
            self._set_alone(job.q.num_gpus, seq, False)
            super()._complete(job, now)
            return
        other = self.jobs[other_seq]
        del self.partner[other_seq]
        self._sync(job, now)
        self._sync(other, now)
        if job.hosts:  # it owned the GPUs: hand them, same devices, to its partner
            for host in job.hosts:
                ids = host.release(job.q.job_id)
                host.commit(other.q.job_id, ResourceSpec(gpus=len(ids)), device_ids=ids)
            other.hosts, job.hosts = job.hosts, []
        job.running = False
        job.version += 1
        del self.running[seq]
        other.speed = 1.0
        self._reschedule(other, now)
        self._set_alone(other.q.num_gpus, other_seq, True)
        self.freed.append(other_seq)
        job.rec.end = now
        self.finished += 1
        self._finish_time_fairness(job, now)
        if self._finished_hook is not None:
            self._finished_hook(job.q, now)

    # -- profiling pool (Lucid) ---------------------------------------------------------------

    def _arrive(self, job: _Job, now: float) -> None:
        if self.profile_s > 0 and job.q.num_gpus <= self.prof_max:
            job.since = now
            self._count_active(now, 1)
            self._integral_at_submit[job.q.seq] = self._active_integral
            heapq.heappush(self.prof_queue, (job.q.num_gpus, job.q.seq))
            return
        super()._arrive(job, now)

    def _handle(self, kind: int, seq: int, version: int, now: float) -> None:
        if kind != PROFILE_END:
            super()._handle(kind, seq, version, now)
            return
        job = self.jobs[seq]
        self._commit_change(now)
        for host in job.hosts:
            host.release(job.q.job_id)
        job.hosts = []
        self.record.integrals.committed_gpus = self._committed()
        if job.q.duration <= self.profile_s:
            job.rec.end = now
            job.q.remaining = 0.0
            self.profile_done += 1
            self.finished += 1
            self._finish_time_fairness(job, now)
            if self._finished_hook is not None:
                self._finished_hook(job.q, now)
            return
        self.profiled += 1
        job.q.remaining = job.q.duration  # the non-intrusive profiler cannot checkpoint it
        self.policy.profiled(job.q, now)
        self._enqueue(job, now)

    def _schedule_profiling(self, now: float) -> None:
        if self.prof_queue and now - min(self.jobs[s].since for _, s in self.prof_queue) > \
                self.profile_s:
            # Time-aware: a job that waited longer than a profiling run for the profiler skips it.
            keep = []
            for entry in self.prof_queue:
                job = self.jobs[entry[1]]
                if now - job.since > self.profile_s:
                    self.skipped_profiling += 1
                    self._enqueue(job, now)
                else:
                    keep.append(entry)
            heapq.heapify(keep)
            self.prof_queue = keep
        while self.prof_queue:
            gpus, seq = self.prof_queue[0]
            host = next(placement.fewest_idle_first(self.prof_cluster, min_idle=gpus, limit=1),
                        None)
            if host is None:
                return  # least-GPU-first, strictly
            heapq.heappop(self.prof_queue)
            job = self.jobs[seq]
            self._commit_change(now)
            host.commit(job.q.job_id, ResourceSpec(gpus=gpus))
            job.hosts = [host]
            self.record.integrals.committed_gpus = self._committed()
            job.rec.start = job.rec.bound = now
            heapq.heappush(self.events, (now + min(job.q.duration, self.profile_s), PROFILE_END,
                                         seq, 0))

    # -- scheduling ---------------------------------------------------------------------------

    def _same_gpus_waiting(self, gpus: int, exclude: int) -> list[_Job]:
        return [self.jobs[s] for _, s in self.waiting
                if s != exclude and self.jobs[s].q.num_gpus == gpus]

    def _take_from_queue(self, jr: _Job, now: float, candidates: list[_Job]) -> int | None:
        """Let ``jr`` pick a queued partner; returns the partner's former queue index."""
        if not candidates:
            return None
        pick = self.policy.partner_from_queue(jr.q, [c.q for c in candidates], now)
        if pick is None:
            return None
        partner = self.jobs[pick.seq]
        index = bisect.bisect_left(self.waiting, (partner.key, partner.q.seq))
        del self.waiting[index]
        self._join(partner, jr, now)
        return index

    def _schedule(self, now: float) -> None:
        if self.profile_s > 0:
            self._schedule_profiling(now)
        policy = self.policy
        if self.pairs and self.freed:
            for seq in self.freed:
                jr = self.jobs[seq]
                if jr.running and seq not in self.partner:
                    self._take_from_queue(jr, now, self._same_gpus_waiting(jr.q.num_gpus, seq))
        self.freed.clear()
        if not self.waiting:
            return
        free = self.cluster.total_gpus - self.cluster.committed_gpus
        demand = sum(self.jobs[s].q.num_gpus for _, s in self.waiting) if self.pairs else 0
        i = 0
        while i < len(self.waiting):
            if free <= 0 and not (self.joins and any(self.alone.values())):
                return
            job = self.jobs[self.waiting[i][1]]
            gpus = job.q.num_gpus
            if self.joins:
                anchors = self.alone.get(gpus)
                # Ask again only when the jobs running alone with this GPU count changed since
                # this job was last turned down (the answer depends on nothing else that moves).
                stamp = self.alone_version.get(gpus, 0)
                if anchors and self.asked.get(job.q.seq) != stamp:
                    pick = policy.partner_among_running(
                        job.q, [self.jobs[s].q for s in anchors], now)
                    self.asked[job.q.seq] = stamp
                    if pick is not None:
                        del self.waiting[i]
                        self._join(job, self.jobs[pick.seq], now)
                        continue
            if gpus <= free:
                picks = self._place(job)
                if picks is not None:
                    del self.waiting[i]
                    crowded = demand > free
                    self._start(job, picks, now)
                    free -= gpus
                    demand -= gpus
                    if self.pairs and crowded:
                        candidates = self._same_gpus_waiting(gpus, job.q.seq)
                        taken = self._take_from_queue(job, now, candidates)
                        if taken is not None:
                            demand -= gpus
                            if taken < i:
                                i -= 1
                    continue
            if not policy.backfill:
                return
            i += 1

    # -- figures --------------------------------------------------------------------------------

    def _report(self) -> None:
        extra = self.record.extra
        extra["shared_jobs"] = len(self.shared)
        done = [j for j in self.jobs if j.rec.end is not None]
        extra["shared_fraction"] = round(len(self.shared) / len(done), 6) if done else 0.0
        if self.profile_s > 0:
            extra["profiled_jobs"] = self.profiled
            extra["finished_in_profiling"] = self.profile_done
            extra["skipped_profiling"] = self.skipped_profiling
        report = getattr(self.policy, "report", None)
        if report is not None:
            extra.update(report())
        gsla = getattr(self.policy, "gsla", None)
        if gsla is None:
            return
        deltas, excess = [], []
        for seq in self.shared:
            job = self.jobs[seq]
            if job.rec.end is None or job.q.duration <= 0:
                continue
            delta = (job.rec.end - self.main_start[seq]) / job.q.duration
            sla = gsla(job.q)
            deltas.append(delta)
            if delta > sla + 1e-9:
                excess.append(100.0 * (delta - sla) / sla)
        extra["gsla_violation_fraction"] = round(len(excess) / len(deltas), 6) if deltas else 0.0
        extra["gsla_violations"] = len(excess)
        # TensorShare's own denominator (sec. 4.1: "the ratio of jobs that violate their gSLA to
        # the total number of jobs"; a job that never shared has delta 1 and cannot violate).
        extra["gsla_violation_fraction_all_jobs"] = (round(len(excess) / len(done), 6)
                                                     if done else 0.0)
        values = np.asarray(excess) if excess else None
        for q in (50, 90, 99):
            extra[f"excess_ratio_p{q}"] = (round(float(np.percentile(values, q)), 3)
                                           if values is not None else None)
        extra["mean_shared_slowdown"] = round(float(np.mean(deltas)), 4) if deltas else None


__all__ = ["TICK", "SharingJobSimulator"]
