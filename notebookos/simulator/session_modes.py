"""How the session engine runs a kernel, chosen by the policy's strategies.

The policy's ``lifetime`` (``ContainerLifetimeStrategy``) and ``binding`` (``GpuBindingStrategy``)
pick one of three mechanisms; the engine (``sessionsim.SessionSimulator``) calls the mode and never
tests the policy's name or flags:

- ``ReplicatedKernels``: long-running replicas placed at session start, GPUs bound per cell as the
  scheduling cycle decides (``notebookos.policies.cycle.run_cycle``, the one the live Global
  Scheduler runs: the executor the policy picks, the post-filter (migration) when no replica's
  host can bind) (``notebookos``);
- ``ReservedKernels``: long-running containers whose GPUs are bound at placement for the session
  (``reservation``);
- ``CellContainers``: a container per cell, placed when the cell is sent (``batch``: cold start and
  state I/O; ``lcp``: a warm pool).

Where new containers start (a kernel's replicas, with the session's GPUs for ``reservation``; a
cell's container; a per-cell kernel's first container, which binds no GPUs and only answers
``kernel_info``) is decided by the container cycle
(``notebookos.policies.container_cycle.run_container_cycle``), the one the live Global
Scheduler runs for them too. The engine models no replica loss, so the replica that binds a
reservation's session GPUs after a replacement (``Purpose.SESSION_GPUS``, live only) is never
decided here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from notebookos.policies.container_cycle import Purpose, run_container_cycle
from notebookos.policies.cycle import Action, CycleResult, Snapshot, Status, run_cycle
from notebookos.policies.profile import Profile

if TYPE_CHECKING:
    from notebookos.simulator.sessionsim import SessionSimulator, _Run, _Sess


class KernelMode:
    """The part of the session engine that depends on the container lifetime and GPU binding."""

    def __init__(self, sim: SessionSimulator) -> None:
        self.sim = sim
        self.policy = sim.policy
        self.binding = sim.policy.binding
        self.lifetime = sim.policy.lifetime
        self.config = sim.config
        self.profile = getattr(sim, "profile", None) or Profile.for_policy(sim.policy)

    def pool_size(self) -> int:
        return self.lifetime.pool_size(self.config.prewarm_per_host)

    # Each mode implements these.
    def on_session_start(self, sess: _Sess, now: float) -> None:
        raise NotImplementedError

    def waiting_need(self, sess: _Sess) -> int:
        """GPUs the waiting session needs on one host before a retry can succeed."""
        raise NotImplementedError

    def retry(self, sess: _Sess, now: float) -> bool:
        raise NotImplementedError

    def wait_amounts_at_teardown(self, sess: _Sess) -> tuple[int, int]:
        raise NotImplementedError

    def can_run(self, sess: _Sess) -> bool:
        """Whether a cell of the session can be started now (its kernel is up)."""
        raise NotImplementedError

    def try_run(self, sess: _Sess, run: _Run, now: float) -> bool:
        """Start ``run`` (the head of the session's queue) or make it wait; False when it waits."""
        raise NotImplementedError

    def on_started(self, sess: _Sess, run: _Run, now: float) -> None:  # noqa: B027 - optional
        """A delayed start (container or migrated replica up): bind what must be bound now."""

    def cell_tail_s(self) -> float:
        """Time a cell keeps its GPUs after its code ends."""
        return 0.0

    def on_end(self, sess: _Sess, run: _Run, now: float) -> None:
        raise NotImplementedError

    def refills_pool_after_use(self) -> bool:
        """A prewarm pool refills in the background after a container is taken from it."""
        return not self.lifetime.per_cell


class SessionKernels(KernelMode):
    """Long-running kernel containers placed when the session starts."""

    def on_session_start(self, sess: _Sess, now: float) -> None:
        self.sim._place_kernel(sess, now)

    def decide_placement(self, sess: _Sess) -> CycleResult:
        """The container cycle on the simulated cluster: the hosts of the kernel's replicas
        (``RESERVE``: the session's GPUs bound on the first, reservation)."""
        return run_container_cycle(Snapshot(self.sim.cluster), sess.s.request, self.profile,
                                   count=self.sim.R)

    def can_run(self, sess: _Sess) -> bool:
        return sess.kernel is not None and sess.ready

    def kernel_wait_amounts(self, sess: _Sess) -> tuple[int, int]:
        gpus = sess.s.request.gpus
        return self.binding.waiting_gpus(gpus), gpus * self.sim.R

    def waiting_need(self, sess: _Sess) -> int:
        if sess.kernel is None:
            return self.binding.waiting_gpus(sess.s.request.gpus)
        return sess.queue[0].task.gpus if sess.queue else 0

    def retry(self, sess: _Sess, now: float) -> bool:
        if sess.kernel is None:
            gpus, subs = self.kernel_wait_amounts(sess)
            self.sim._leave_wait(sess, gpus, subs)
            return self.sim._place_kernel(sess, now)
        run = sess.queue[0]
        self.sim._leave_wait(sess, run.task.gpus, 0)
        return self.sim._try_run(sess, now)

    def wait_amounts_at_teardown(self, sess: _Sess) -> tuple[int, int]:
        return self.kernel_wait_amounts(sess) if sess.kernel is None else (0, 0)


class ReplicatedKernels(SessionKernels):
    """GPUs bound per cell on the executor replica; migration when no replica's host can bind."""

    def decide(self, sess: _Sess, run: _Run) -> CycleResult:
        """The scheduling cycle on the simulated cluster (no device view: nothing to share)."""
        return run_cycle(Snapshot(self.sim.cluster), sess.kernel, run.task.request, self.profile)

    def try_run(self, sess: _Sess, run: _Run, now: float) -> bool:
        sim = self.sim
        kernel = sess.kernel
        request = run.task.request
        result = self.decide(sess, run)
        if result.status is Status.ERROR:
            raise RuntimeError(f"kernel {kernel.kernel_id}: {result.reason}")
        if result.status is Status.SUCCESS and result.action is Action.EXECUTE:
            replica = kernel.replicas[result.replica_id]
            host = sim.cluster.hosts[replica.host_id]
            sess.queue.popleft()
            sim._books(now)
            host.commit(replica.owner, request)
            sim._add_standby(-1, kernel.request.gpus)
            sim._refresh_books()
            kernel.executor = replica.replica_id
            run.host_id, run.owner = host.host_id, replica.owner
            run.rec.bound = now
            if sess.last_exec is not None:
                run.rec.reused_executor = sess.last_exec == (replica.replica_id, host.host_id)
            sim._start(sess, run, now)
            return True
        if result.status is not Status.SUCCESS or result.action is not Action.MIGRATE:
            # unschedulable (for now or for good), waiting; a share decision needs a device
            # view the simulated cluster does not give, so it never comes here
            sim._enter_wait(sess, run.task.gpus, 0, now)
            return False
        migration = result.migration
        sess.queue.popleft()
        sim._books(now)
        rid = migration.replica_id
        sim.cluster.remove_replica(kernel.kernel_id, rid)
        sim.maybe_empty = True
        replica = sim.cluster.place_replica(kernel.kernel_id, rid, migration.target_host_id)
        host = sim.cluster.hosts[migration.target_host_id]
        host.reserve(replica.owner, request)
        sim._refresh_books()
        kernel.executor = rid
        sim.record.migrations += 1
        run.rec.migrated = True
        if sess.last_exec is not None:
            run.rec.reused_executor = False
        run.host_id, run.owner = host.host_id, replica.owner
        latency = self.config.migration_state_s + sim._take_warm(
            host.host_id, now, self.config.prewarm_promotion_s)
        sess.current = run
        sim._push_start(now + latency, sess, run)
        return True

    def on_started(self, sess: _Sess, run: _Run, now: float) -> None:
        sim = self.sim
        sim._books(now)
        sim.cluster.hosts[run.host_id].commit(run.owner, run.task.request)
        run.rec.bound = now  # GPUs bound once the migrated replica is up
        sim._add_standby(-1, sess.kernel.request.gpus)
        sim._refresh_books()

    def on_end(self, sess: _Sess, run: _Run, now: float) -> None:
        sim = self.sim
        host = sim.cluster.hosts[run.host_id]
        host.release(run.owner)
        sim._add_standby(1, sess.kernel.request.gpus)
        sess.last_exec = (sess.kernel.executor, run.host_id)


class ReservedKernels(SessionKernels):
    """The kernel's GPUs were bound at placement: a cell runs at once on its one container."""

    def try_run(self, sess: _Sess, run: _Run, now: float) -> bool:
        sess.queue.popleft()
        replica = sess.kernel.replicas[0]
        run.host_id, run.owner = replica.host_id, replica.owner
        run.rec.bound = now
        run.rec.reused_executor = None if sess.last_exec is None else True
        self.sim._start(sess, run, now)
        return True

    def cell_tail_s(self) -> float:
        """The reply waits for the state to be persisted (appendix A.3 step 9: on the critical
        path for a reservation, off it for NotebookOS's replicas, which sync asynchronously)."""
        return self.config.state_write_s

    def on_end(self, sess: _Sess, run: _Run, now: float) -> None:
        sess.last_exec = (0, run.host_id)


class CellContainers(KernelMode):
    """A container per cell: placed (GPUs bound) when the cell is sent, removed when it ends."""

    def __init__(self, sim: SessionSimulator) -> None:
        super().__init__(sim)
        self.first_containers_unplaced = 0  # sessions whose first container found no host

    def decide_first_container(self, sess: _Sess) -> CycleResult:
        """The container cycle for the container that answers the session's first
        ``kernel_info`` (``ANSWER_ONLY``: it binds no GPUs), as the live Global Scheduler takes
        it at StartKernel."""
        return run_container_cycle(Snapshot(self.sim.cluster), sess.s.request, self.profile,
                                   purpose=Purpose.ANSWER_ONLY)

    def on_session_start(self, sess: _Sess, now: float) -> None:
        # The first container's decision, taken where the live scheduler takes it. It is
        # parked as soon as it has answered, before any cell: it holds no GPUs and no
        # subscription afterwards, and its start is not on a cell's path, so nothing more is
        # modelled. One that finds no host (the live StartKernel is refused) is counted; the
        # session's cells still come (the trace's problem), as before.
        result = self.decide_first_container(sess)
        if result.status is Status.ERROR:
            raise RuntimeError(f"session {sess.s.session_id}: {result.reason}")
        if not result.placed:
            self.first_containers_unplaced += 1
        sess.ready = True

    def can_run(self, sess: _Sess) -> bool:
        return True  # nothing to wait for: the cell's container is placed when it is sent

    def waiting_need(self, sess: _Sess) -> int:
        return sess.queue[0].task.gpus if sess.queue else 0

    def retry(self, sess: _Sess, now: float) -> bool:
        run = sess.queue[0]
        self.sim._leave_wait(sess, run.task.gpus, 0)
        return self.sim._try_run(sess, now)

    def wait_amounts_at_teardown(self, sess: _Sess) -> tuple[int, int]:
        return 0, 0

    def decide(self, run: _Run) -> CycleResult:
        """The container cycle on the simulated cluster: the host of the cell's container."""
        return run_container_cycle(Snapshot(self.sim.cluster), run.task.request, self.profile)

    def try_run(self, sess: _Sess, run: _Run, now: float) -> bool:
        sim = self.sim
        request = run.task.request
        result = self.decide(run)
        if result.status is Status.ERROR:
            raise RuntimeError(f"session {sess.s.session_id}: {result.reason}")
        if not result.placed:  # unschedulable (for now or for good: the trace's problem)
            sim._enter_wait(sess, run.task.gpus, 0, now)
            return False
        sess.queue.popleft()
        host = sim.cluster.hosts[result.host_id]
        sim._books(now)
        container = f"{run.task.task_id}#c"
        sim.cluster.add_kernel(container, request)
        replica = sim.cluster.place_replica(container, 0, host.host_id)
        host.commit(replica.owner, request)
        sim._refresh_books()
        run.host_id, run.owner, run.container = host.host_id, replica.owner, container
        run.rec.bound = now
        if sess.last_exec is not None:
            run.rec.reused_executor = False
        if sim.pool_size == 0:  # a cold container reads the session's state first
            latency = self.config.container_start_s + self.config.state_read_s
        else:
            latency = sim._take_warm(host.host_id, now, 0.0) + self.config.lcp_warmup_s
        sess.current = run
        sim._push_start(now + latency, sess, run)
        return True

    def cell_tail_s(self) -> float:
        """A cold container without a pool writes the state back before giving up its GPUs."""
        return self.config.state_write_s if (self.lifetime.state_io
                                             and self.sim.pool_size == 0) else 0.0

    def on_end(self, sess: _Sess, run: _Run, now: float) -> None:
        sim = self.sim
        sim.cluster.remove_kernel(run.container)
        sim.maybe_empty = True
        if sim.pool_size and run.host_id in sim.warm:
            sim.warm[run.host_id] = min(sim.pool_size, sim.warm[run.host_id] + 1)
        sess.last_exec = (0, run.host_id)


def mode_for(sim: SessionSimulator) -> KernelMode:
    """The mechanism the policy's strategies call for."""
    policy = sim.policy
    if policy.lifetime.per_cell:
        return CellContainers(sim)
    if policy.binding.binds_at_placement:
        return ReservedKernels(sim)
    return ReplicatedKernels(sim)
