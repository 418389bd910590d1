"""The session engine: session policies (``notebookos``, ``reservation``, ``batch``, ``lcp``, and
any plug-in of kind ``session``) on notebook sessions.

Each session is a kernel with long life and short GPU tasks (cells). The policy decides replicas,
hosts, the executor, migrations and scaling; this engine applies its decisions through the core
accounting (``Cluster``/``Host``), adds the configured latencies and records every task. What
depends on the container lifetime and the GPU binding lives in ``session_modes`` (chosen by the
policy's strategies). docs/simulator.md lists the semantics.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from notebookos.cluster import Cluster, Kernel, ReplicaState
from notebookos.policies import placement
from notebookos.policies.base import Policy, ScalingView
from notebookos.policies.cell_order import ArrivalOrder, WaitingCell, cell_order_for
from notebookos.policies.container_cycle import run_container_cycle
from notebookos.policies.cycle import Action, Snapshot, Status
from notebookos.policies.profile import Profile
from notebookos.policies.scale_in import DEFAULT_LIMIT, effective_mode, releasable_hosts
from notebookos.simulator.config import SimConfig
from notebookos.simulator.hibernation import Hibernation
from notebookos.simulator.hosts import HostFactory
from notebookos.simulator.records import RunRecord, TaskRecord
from notebookos.simulator.session_modes import mode_for
from notebookos.workload.model import Session, Task, Workload

# Event kinds, in the order they apply at one instant.
TASK_END, HOST_READY, KERNEL_READY, TASK_START, PREWARM, SESSION_STOP, SESSION_START, \
    TASK_SUBMIT, SCALE_TICK, HIBERNATE = range(10)


@dataclass(slots=True)
class _Run:
    task: Task
    rec: TaskRecord
    host_id: str = ""
    owner: str = ""
    container: str = ""  # batch/lcp: the per-cell container's kernel id
    cell: WaitingCell | None = None  # as the cell order sees it, from its first try


@dataclass(slots=True)
class _Sess:
    s: Session
    index: int
    kernel: Kernel | None = None
    ready: bool = False
    stopped: bool = False
    ended: bool = False
    waiting: bool = False  # in the engine's wait list
    queue: deque = field(default_factory=deque)  # _Run not yet started, in submit order
    current: _Run | None = None
    last_exec: tuple[int, str] | None = None
    cells: int = 0
    submitted: int = 0
    wait_hosts: int = 0  # hosts this waiting kernel asked for
    hibernated: int = 0  # replicas the hibernated kernel stopped (0: awake)
    idle_token: int = 0  # the idle clock's generation (hibernation.py)
    wake_started: float | None = None  # a wake's first cell arrived then


class SessionSimulator:
    def __init__(self, workload: Workload, policy: Policy, config: SimConfig,
                 progress: Callable[[float], None] | None = None,
                 profile: Profile | None = None) -> None:
        self.policy = policy
        # The scheduling profile the cycles run (its policy is ``policy``): the live Global
        # Scheduler's, given by a replay; else the policy's own (session_modes.KernelMode).
        self.profile = profile
        self.config = config
        self.progress = progress
        self.R = policy.replicas_per_kernel
        self.cluster = Cluster(replicas_per_kernel=self.R)
        oversub = self.R * float(getattr(policy, "max_subscription_ratio", 1.0))
        self.factory = HostFactory(self.cluster, config.gpus_per_host, oversub)
        self.record = RunRecord(policy.name)
        self.sessions = [_Sess(s, i) for i, s in enumerate(workload.sessions)]
        self.events: list = []
        self.seq = 0
        self.provisioning = 0
        self.wait: deque[_Sess] = deque()
        # The live Global Scheduler's cell queue order (global_scheduler.cell_order): the
        # profile's queue-sort plug-in when given (with its configuration section).
        self.cell_order = (profile.queue_sort if profile is not None
                           and profile.queue_sort is not None
                           else cell_order_for(config.cell_order))
        self.waiting_gpus = 0
        self.waiting_subscriptions = 0
        self.warm: dict[str, int] = {}  # per host: prewarm (notebookos) or warm (lcp) containers
        self.active_sessions = 0
        self.maybe_empty = True  # something may have left a host since the last look
        self.next_drain = 0.0
        self.running_tasks = 0
        self.live_sessions = len(self.sessions)
        self.binding = policy.binding
        self.mode = mode_for(self)
        self.hibernation = Hibernation(self, HIBERNATE)
        self.pool_size = self.mode.pool_size()
        self.record.reserves_gpus = self.binding.binds_at_placement
        # The uncontended request path: every policy pays the hops, replicated kernels the
        # executor election too (appendix A.3 steps 1-7).
        self.path_latency = config.request_overhead_s + (config.election_s if self.R > 1 else 0.0)
        self.running_gpus = 0
        self.waiting_hosts = 0
        self.reserved: dict[str, None] = {}  # new hosts held for kernels that wait for hosts
        self.scale_in = effective_mode(policy)  # a policy that cannot migrate: empty hosts only
        self.sr_limit = getattr(policy, "sr_limit_for", None)
        span = workload.span_s
        self.sample_every = max(1.0, span / config.timeline_points)
        self.next_sample = 0.0
        for sess in self.sessions:
            self._push(sess.s.start, SESSION_START, sess)
            for task in sess.s.tasks:
                rec = TaskRecord(task.task_id, task.session_id, task.gpus, task.submit,
                                 task.duration)
                self.record.tasks.append(rec)
                self._push(task.submit, TASK_SUBMIT, (sess, _Run(task, rec)))
            if sess.s.stop is not None:
                self._push(max(sess.s.stop, sess.s.start), SESSION_STOP, sess)
        self.record.tasks.sort(key=lambda r: (r.submit, r.task_id))

    # -- small helpers ------------------------------------------------------------------------

    def _push(self, when: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, kind, self.seq, payload))

    def _books(self, now: float) -> None:
        """Bring the integrals to ``now`` (call before any change they depend on)."""
        self.record.integrals.advance(now)

    def _refresh_books(self) -> None:
        integ = self.record.integrals
        integ.hosts = len(self.cluster.hosts) + self.provisioning
        integ.committed_gpus = self.cluster.committed_gpus

    def _add_standby(self, replicas: int, gpus_each: int) -> None:
        """``replicas`` replicas of ``gpus_each`` GPUs each become standby (negative: stop)."""
        integ = self.record.integrals
        integ.standby_gpu_equiv += replicas * gpus_each
        integ.standby_replicas += replicas

    def _sample(self, now: float) -> None:
        while self.next_sample <= now:
            self.record.timeline.append((
                round(self.next_sample, 3), self.active_sessions, self.running_tasks,
                sum(len(s.queue) for s in self.wait), len(self.cluster.hosts),
                (len(self.cluster.hosts) + self.provisioning) * self.config.gpus_per_host,
                self.cluster.committed_gpus, round(self.cluster.subscription_ratio(), 4),
                self.record.migrations, self.running_gpus,
                "" if self.sr_limit is None else round(self.sr_limit(self.cluster), 4)))
            self.next_sample += self.sample_every

    # -- hosts and scaling ----------------------------------------------------------------------

    def _host_up(self, now: float) -> str:
        host = self.factory.new_host()
        self.warm[host.host_id] = self.pool_size
        return host.host_id

    def _release_reservations(self) -> None:
        """Hosts held for waiting kernels that are used now, or more than are still wanted,
        go back to the autoscaler."""
        for host_id in list(self.reserved):
            host = self.cluster.hosts.get(host_id)
            if host is None or not host.is_empty or len(self.reserved) > self.waiting_hosts:
                del self.reserved[host_id]

    def _autoscale(self, now: float) -> bool:
        """Apply the policy's scaling decision; True when hosts were added or released."""
        if not self.config.autoscale:
            return False
        changed = False
        gph = self.config.gpus_per_host
        floor = self.config.hosts  # --cluster is the initial and the smallest cluster
        view = ScalingView(
            hosts=len(self.cluster.hosts) + self.provisioning, gpus_per_host=gph,
            committed_gpus=self.cluster.committed_gpus, waiting_gpus=self.waiting_gpus,
            subscribed_gpus=self.cluster.subscribed_gpus + self.waiting_subscriptions,
            waiting_hosts=self.waiting_hosts)
        decision = self.policy.scaling(view)
        surplus = view.hosts - max(floor, self.policy.target_hosts(view))
        mode = self.scale_in
        drain = mode == "drain" and now >= self.next_drain \
            and surplus > self.config.drain_hysteresis_hosts
        if decision.add_hosts == 0 and surplus > 0 and (self.maybe_empty or mode == "idle"
                                                        or drain):
            # Which hosts go, in which order, is the live autoscaler's decision
            # (policies/scale_in.py): scale_in=empty, hosts holding nothing; scale_in=idle (the
            # paper), hosts with no GPU bound, whose standby replicas move first; scale_in=drain
            # (the prototype), that only above a hysteresis, at most once every 10 scaling
            # intervals (when to look is the simulator's; below it, empty hosts only). Looked
            # for only now (a bounded walk of the cluster's indexes), and for empty hosts only if
            # something left a host since the last look found none. Hosts held for waiting
            # kernels are kept.
            count = min(surplus, self.policy.max_release_per_tick)
            if mode == "drain" and not drain:
                mode = "empty"
            candidates = releasable_hosts(
                self.cluster, mode, keep=self.reserved.__contains__,
                limit=getattr(self.policy, "candidate_limit", DEFAULT_LIMIT))[:count]
            if mode == "drain" and any(not self.cluster.hosts[h].is_empty for h in candidates):
                self.next_drain = now + 10 * self.config.scaling_interval_s
            releasable = self._drain_hosts(candidates)
            self.maybe_empty = bool(releasable)
            if releasable:
                decision = self.policy.scaling(
                    dataclasses.replace(view, releasable_host_ids=tuple(releasable)))
        add = max(decision.add_hosts, floor - view.hosts)
        if add > 0:
            add = min(add, self.config.max_hosts - view.hosts)
            if add > 0:
                self._books(now)
                self.provisioning += add
                self.record.scale_outs += add
                for _ in range(add):
                    self._push(now + self.config.host_provision_s, HOST_READY, None)
                self._refresh_books()
                changed = True
        for host_id in decision.release_host_ids:
            host = self.cluster.hosts.get(host_id)
            if host is None or not host.is_empty:
                continue
            if len(self.cluster.hosts) + self.provisioning <= floor:
                break
            self._books(now)
            self.cluster.remove_host(host_id)
            self.warm.pop(host_id, None)
            self.record.scale_ins += 1
            self._refresh_books()
            changed = True
        return changed

    def _drain_hosts(self, candidates: list[str]) -> list[str]:
        """Move the replicas off the ``candidates`` (``releasable_hosts``' first ones, in its
        order) that hold some; returns the hosts left empty, in that order."""
        emptied: list[str] = []
        draining: set[str] = set()
        for host_id in candidates:
            host = self.cluster.hosts[host_id]
            draining.add(host_id)
            for owner in sorted(host.owners):
                kernel_id, _, rid_text = owner.rpartition("/")
                kernel = self.cluster.kernels.get(kernel_id)
                if kernel is None:
                    break
                # the container cycle, as the live drain (host_drain.py ``_drain_one``) takes
                # it: the hosts being drained take nothing new
                result = run_container_cycle(
                    Snapshot(self.cluster, unavailable_hosts=frozenset(draining)),
                    kernel.request, self.mode.profile,
                    exclude=tuple(sorted({r.host_id for r in kernel.live_replicas()})))
                if result.status is Status.ERROR:
                    raise RuntimeError(f"kernel {kernel_id}: {result.reason}")
                if not result.placed:
                    break
                rid = int(rid_text)
                self.cluster.remove_replica(kernel_id, rid)
                replica = self.cluster.place_replica(kernel_id, rid, result.host_id)
                replica.state = ReplicaState.RUNNING
                self.record.migrations += 1
                self.record.scale_in_migrations += 1
            if host.is_empty:
                emptied.append(host_id)
        return emptied

    # -- waiting -----------------------------------------------------------------------------------

    def _enter_wait(self, sess: _Sess, gpus: int, subscriptions: int, now: float,
                    hosts: int = 0) -> None:
        if not sess.waiting:
            sess.waiting = True
            self.wait.append(sess)
            self.waiting_gpus += gpus
            self.waiting_subscriptions += subscriptions
            sess.wait_hosts = hosts
            self.waiting_hosts += hosts
            self._autoscale(now)
            self._provision_for_waiting(now)

    def _provision_for_waiting(self, now: float) -> None:
        """A request that fits no host gets new hosts at once (a failed placement asks the
        provider for hosts, as the prototype does), whatever the capacity count says: free GPUs
        scattered over busy hosts do not fit it."""
        if not self.config.autoscale:
            return
        gph = self.config.gpus_per_host
        short = -(-self.waiting_gpus // gph) + self.waiting_hosts - self.provisioning
        add = min(short, self.config.max_hosts - len(self.cluster.hosts) - self.provisioning)
        if add > 0:
            self._books(now)
            self.provisioning += add
            self.record.scale_outs += add
            for _ in range(add):
                self._push(now + self.config.host_provision_s, HOST_READY, None)
            self._refresh_books()

    def _leave_wait(self, sess: _Sess, gpus: int, subscriptions: int) -> None:
        sess.waiting = False
        self.wait.remove(sess)
        self.waiting_gpus -= gpus
        self.waiting_subscriptions -= subscriptions
        self.waiting_hosts -= sess.wait_hosts
        sess.wait_hosts = 0
        if self.reserved:
            self._release_reservations()

    def _drain(self, now: float) -> None:
        """Capacity changed: retry waiting sessions in arrival order (strict for no-backfill)."""
        if not self.wait:
            return
        top = next(placement.most_idle_first(self.cluster, limit=1), None)
        max_idle = 0 if top is None else top.idle_gpus
        for sess in self._wait_order(now):
            if not sess.waiting:
                continue
            need = self._waiting_need(sess)
            if need > max_idle:
                if not self.policy.backfill:
                    return
                continue
            if not self._retry(sess, now) and not self.policy.backfill:
                return
            top = next(placement.most_idle_first(self.cluster, limit=1), None)
            max_idle = 0 if top is None else top.idle_gpus

    def _wait_order(self, now: float) -> list[_Sess]:
        """The waiting sessions in the cell order: arrival, or (themis, qssf) the order's key
        of each one's waiting cell; sessions waiting for their kernel's hosts keep arrival
        order, ahead of the cells."""
        if isinstance(self.cell_order, ArrivalOrder):
            return list(self.wait)
        self.cell_order.set_capacity(self.cluster.total_gpus)
        kernels = [s for s in self.wait if not s.queue or s.queue[0].cell is None]
        cells = [s for s in self.wait if s.queue and s.queue[0].cell is not None]
        cells.sort(key=lambda s: self.cell_order.key(s.queue[0].cell, now))
        return kernels + cells

    def _waiting_need(self, sess: _Sess) -> int:
        return self.mode.waiting_need(sess)

    def _retry(self, sess: _Sess, now: float) -> bool:
        return self.mode.retry(sess, now)

    # -- kernels -----------------------------------------------------------------------------------

    def _place_kernel(self, sess: _Sess, now: float) -> bool:
        """Place a session's long-running kernel (its replicas) as the policy chooses."""
        request = sess.s.request
        result = self.mode.decide_placement(sess)
        if result.status is Status.ERROR:
            raise RuntimeError(f"session {sess.s.session_id}: {result.reason}")
        if not result.placed:
            # A failed placement (3.4.2): the kernel waits, and asks for the hosts it lacks (a
            # kernel that binds GPUs at placement asks for its GPUs instead).
            gpus, subs = self.mode.kernel_wait_amounts(sess)
            lacking = 0 if gpus else self.R - len(result.hosts)
            self._enter_wait(sess, gpus, subs, now, lacking)
            return False
        hosts = [self.cluster.hosts[h] for h in result.hosts]
        self._books(now)
        kernel = self.cluster.add_kernel(sess.s.session_id, request)
        for rid, host in enumerate(hosts):
            replica = self.cluster.place_replica(kernel.kernel_id, rid, host.host_id)
            if result.action is Action.RESERVE and host.host_id == result.host_id:
                host.commit(replica.owner, request)  # the session's GPUs
        sess.kernel = kernel
        if not self.binding.binds_at_placement:
            self._add_standby(len(hosts), request.gpus)
        self.record.integrals.replicas += len(hosts)
        self._refresh_books()
        latency = self.config.container_start_s if sess.wake_started is None else \
            self.hibernation.latency([h.host_id for h in hosts], now)
        self._push(now + latency, KERNEL_READY, sess)
        return True

    def _teardown(self, sess: _Sess, now: float) -> None:
        sess.ended = True
        for run in sess.queue:  # cells that never ran
            if run.cell is not None:
                self.cell_order.cell_left(run.cell, now)
        self.active_sessions -= 1
        self.live_sessions -= 1
        if sess.waiting:
            gpus, subs = self.mode.wait_amounts_at_teardown(sess)
            self._leave_wait(sess, gpus, subs)
        if sess.kernel is not None:
            self._books(now)
            if not self.binding.binds_at_placement:
                self._add_standby(-len(sess.kernel.replicas), sess.s.request.gpus)
            self.record.integrals.replicas -= len(sess.kernel.replicas)
            self.cluster.remove_kernel(sess.kernel.kernel_id)
            sess.kernel = None
            self.maybe_empty = True
            self._refresh_books()
        self.hibernation.ended(sess, now)
        self._drain(now)

    def _maybe_teardown(self, sess: _Sess, now: float) -> None:
        # A cell submitted after the session's stop (a malformed template) still runs: the
        # session ends once every cell has been submitted and it is idle.
        if sess.submitted < len(sess.s.tasks):
            return
        done = sess.stopped or (sess.s.stop is None and sess.cells == len(sess.s.tasks))
        if done and sess.current is None and not sess.queue and not sess.ended:
            self._teardown(sess, now)

    # -- tasks --------------------------------------------------------------------------------------

    def _try_run(self, sess: _Sess, now: float) -> bool:
        """Start the session's next cell if possible; returns False when it had to wait."""
        if sess.current is not None or not sess.queue or sess.ended:
            return True
        if sess.hibernated:
            self.hibernation.wake(sess, now)  # KERNEL_READY calls again
            return True
        if not self.mode.can_run(sess):
            return True  # KERNEL_READY will call again
        run = sess.queue[0]
        if run.cell is None:
            task = run.task
            run.cell = WaitingCell(sess.s.session_id, task.task_id, task.user or sess.s.session_id,
                                   sess.s.session_id, task.gpus, now, self.seq)
            self.cell_order.cell_waiting(run.cell, now)
        return self.mode.try_run(sess, run, now)

    def _push_start(self, when: float, sess: _Sess, run: _Run) -> None:
        self._push(when, TASK_START, (sess, run))

    def _take_warm(self, host_id: str, now: float, warm_latency: float) -> float:
        """Latency to get a container on ``host_id``: a warm one if the pool has one (refilled
        after a cold start), else a cold start."""
        if self.warm.get(host_id, 0) > 0:
            self.warm[host_id] -= 1
            if self.mode.refills_pool_after_use():  # a prewarm pool refills in the background
                self._push(now + self.config.container_start_s, PREWARM, host_id)
            return warm_latency
        return self.config.container_start_s

    def _start(self, sess: _Sess, run: _Run, now: float) -> None:
        """The cell's GPUs are bound on its container: its code starts after the request path
        (network hops, and the executor election for replicated kernels)."""
        sess.current = run
        if run.cell is not None:
            self.cell_order.cell_started(run.cell, now)
        start = now + self.path_latency
        run.rec.start = start
        run.rec.host = run.host_id
        run.rec.executor = run.owner
        self.running_tasks += 1
        self.running_gpus += run.task.gpus
        self._push(start + run.task.duration + self.mode.cell_tail_s(), TASK_END, (sess, run))

    def _end(self, sess: _Sess, run: _Run, now: float) -> None:
        run.rec.end = now
        if run.cell is not None:
            self.cell_order.cell_finished(run.cell, now - (run.rec.start or now), now)
        self.running_tasks -= 1
        self.running_gpus -= run.task.gpus
        sess.current = None
        sess.cells += 1
        self._books(now)
        self.mode.on_end(sess, run, now)
        self._refresh_books()
        self.hibernation.active(sess, now)
        # As live: the freed GPUs go to the cells already waiting (in the cell order) before
        # this session's next cell, which arrives after them.
        self._drain(now)
        self._try_run(sess, now)
        self._maybe_teardown(sess, now)
        self._drain(now)

    # -- the loop -----------------------------------------------------------------------------------

    def run(self) -> RunRecord:
        wall = time.perf_counter()
        for _ in range(self.config.hosts):
            self._host_up(0.0)
        self._refresh_books()
        if self.config.autoscale:
            self._push(0.0, SCALE_TICK, None)
        total = max(1, len(self.sessions))
        processed = 0
        now = 0.0
        while self.events:
            when, kind, _, payload = heapq.heappop(self.events)
            if kind == HIBERNATE and self.hibernation.stale(*payload):
                continue  # nothing happens: the run's clock (and its end) stays put
            now = when
            self._sample(now)
            if kind == TASK_SUBMIT:
                sess, run = payload
                sess.submitted += 1
                if sess.ended:
                    continue
                sess.queue.append(run)
                if not sess.waiting:
                    self._try_run(sess, now)
            elif kind == TASK_END:
                self._end(*payload, now)
            elif kind == TASK_START:
                sess, run = payload
                self.mode.on_started(sess, run, now)
                self._start(sess, run, now)
            elif kind == SESSION_START:
                self.active_sessions += 1
                if payload.s.request.gpus > self.config.gpus_per_host:
                    self.record.unschedulable.append(payload.s.session_id)
                    payload.stopped = True
                    self._teardown(payload, now)
                else:
                    self.mode.on_session_start(payload, now)
            elif kind == KERNEL_READY:
                if not payload.ended:
                    payload.ready = True
                    for replica in payload.kernel.replicas.values():
                        replica.state = ReplicaState.RUNNING
                    if payload.wake_started is not None:
                        self.hibernation.woke(payload, now)
                    self.hibernation.active(payload, now)
                    self._try_run(payload, now)
            elif kind == SESSION_STOP:
                payload.stopped = True
                self._maybe_teardown(payload, now)
            elif kind == HOST_READY:
                self._books(now)
                self.provisioning -= 1
                host_id = self._host_up(now)
                if self.waiting_hosts > len(self.reserved):
                    # Asked for by a kernel whose replicas found no host (3.4.2): held for it,
                    # not released by the scale-in, until the waiting kernels are placed.
                    self.reserved[host_id] = None
                self._refresh_books()
                self._drain(now)
                self._release_reservations()
            elif kind == PREWARM:
                if payload in self.warm:
                    self.warm[payload] = min(self.pool_size, self.warm[payload] + 1)
            elif kind == HIBERNATE:
                self.hibernation.due(*payload, now)
            elif kind == SCALE_TICK:
                self.policy.observe(self.cluster)
                changed = self._autoscale(now)
                stuck = not self.events and not self.provisioning and not changed
                if self.live_sessions > 0 and not stuck:
                    self._push(now + self.config.scaling_interval_s, SCALE_TICK, None)
            processed += 1
            if self.progress is not None and processed % 2048 == 0:
                self.progress(1.0 - self.live_sessions / total)
        self._books(now)
        self.record.end_time = now
        self.record.wall_s = time.perf_counter() - wall
        if self.progress is not None:
            self.progress(1.0)
        return self.record
