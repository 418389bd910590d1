"""Hibernation: a notebook idle for long gives back everything it holds and keeps its state.

Mixed into ``GlobalSchedulerService`` (issue 34). A kernel of long-running replicas with no cell
for ``global_scheduler.hibernate_after_s``:

1. *hibernating*: its executor's checkpoint is made to cover its last completed cell (the
   replica's ``replica_status`` shows ``checkpoint_count`` caught up and nothing pending, as a
   per-cell container's before it is stopped); a cell that arrives meanwhile waits;
2. its replicas are stopped (GPUs a reservation held for the session are given back) and it is
   *hibernated*: no replica runs, the front stays bound and answers ``kernel_info``, interrupts
   and the heartbeat, the provisioner's ``poll()`` says alive, the registry keeps it (a restarted
   Global Scheduler keeps it hibernated);
3. the next cell (or ``WakeKernel``: REST, the JupyterLab panel) wakes it: three replicas start
   from the checkpoint (a host's prewarm pool where it has one) and the cell runs there, its
   output saying in one line that the notebook woke and how long it took.

The idle clock: one delayed call per kernel at a time on the scheduler's timer (no polling, no
thread per kernel); when it fires early (a cell ran since) it is set again for the rest.

A wake runs as a coroutine on the fronts' loop (``_wake``, issue 32): its decisions under the
lock, awaited, its Local Scheduler calls in the ``gs-work`` pool, and its wait for the new
replicas to answer on the loop, so a wake in progress holds no thread while they start.
"""

from __future__ import annotations

import logging
import time

from notebookos.global_scheduler import background
from notebookos.global_scheduler.control import ControlError, control_request
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.hosts import _release_timer
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.proto import local_scheduler_pb2

log = logging.getLogger(__name__)

ASLEEP = ("hibernating", "hibernated", "waking")  # the kernel's states while it sleeps


class HibernationMixin:
    hibernate_after_s: float = 0.0

    # -- the idle clock -------------------------------------------------------------------------

    def _active(self, entry: KernelEntry) -> None:
        """A cell arrived or ended, or the kernel started or woke: the idle clock restarts.
        Lock held."""
        entry.last_active = time.monotonic()
        if self.hibernate_after_s > 0 and self.mode.hibernates and not entry.hibernation_armed:
            self._arm_hibernation(entry, self.hibernate_after_s)

    def _arm_hibernation(self, entry: KernelEntry, delay_s: float) -> None:
        entry.hibernation_armed = True
        kernel_id = entry.kernel_id
        _release_timer().after(max(delay_s, 0.0),
                               lambda: self._pool.submit(self._hibernation_due, kernel_id))

    def _hibernation_due(self, kernel_id: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is None or self._stop.is_set():
                return
            entry.hibernation_armed = False
            if entry.state in ASLEEP or entry.state in ("stopping", "failed"):
                return
            left = entry.last_active + self.hibernate_after_s - time.monotonic()
            busy = entry.executions or entry.cell_arrived or entry.state != "idle" \
                or len(entry.replicas) < self.replicas_per_kernel \
                or self.migration_running(kernel_id)
            if left > 0 or busy:
                if busy and left <= -2 * self.hibernate_after_s:
                    self._say_why_awake(entry)
                self._arm_hibernation(entry, left if left > 0 else self.hibernate_after_s)
                return
            entry.state = "hibernating"
            kernel = self.cluster.kernels.get(kernel_id)
            executor = kernel.executor if kernel is not None else None
            holder = entry.replicas.get(executor) if executor else None
            holder = holder or next(iter(entry.replicas.values()))
            self._save_kernel(entry)
        self._hibernate(entry, holder)

    def _say_why_awake(self, entry: KernelEntry) -> None:
        """A kernel idle for three hibernation times that still counts as busy: log why, once
        per reason (a cell's bookkeeping left behind keeps it awake for good). Lock held."""
        why = []
        if entry.executions:
            why.append(f"cells running {sorted(entry.executions)}")
        if entry.cell_arrived:
            why.append(f"cells waiting to start {sorted(entry.cell_arrived)}")
        if entry.state != "idle":
            why.append(f"state {entry.state}")
        if len(entry.replicas) < self.replicas_per_kernel:
            why.append(f"{len(entry.replicas)} replicas")
        if self.migration_running(entry.kernel_id):
            why.append("a change of its replicas in progress")
        said = "; ".join(why)
        if said != entry.awake_because:
            entry.awake_because = said
            log.info("kernel %s: no cell arrived or ended for %.0f s, not hibernated: %s",
                     entry.kernel_id,
                     time.monotonic() - entry.last_active, said)

    # -- going to sleep -------------------------------------------------------------------------

    def _hibernate(self, entry: KernelEntry, holder) -> None:  # noqa: ANN001 - a ReplicaLink
        kernel_id = entry.kernel_id
        started = time.monotonic()
        running = self._background_work(entry)
        if running:  # stopping the replicas would end it without a word: stay awake
            with self.lock:
                if not self._still_hibernating(entry):
                    return
                self._stay_awake(entry, "not hibernated: its cells left work running in the "
                                 f"background ({', '.join(running[:5])})")
            log.info("kernel %s: not hibernated: %s runs in the background", kernel_id,
                     ", ".join(running))
            return
        holder = self._checkpoint_writer(entry, holder)
        count = self._await_checkpoint(entry, holder, strict=True)
        with self.lock:
            if not self._still_hibernating(entry):
                return
            if count is None:  # the checkpoint could not be confirmed: stay awake, try later
                self._stay_awake(entry, entry.message)
                log.warning("kernel %s: not hibernated: its checkpoint could not be confirmed",
                            kernel_id)
                return
            replicas = list(entry.replicas.values())
            kernel = self.cluster.kernels.get(kernel_id)
            session = entry.session_gpus
            if session is not None and kernel is not None and session[0] in kernel.replicas:
                host = self.cluster.hosts.get(session[1])
                if host is not None and host.commitment_of(kernel.replicas[session[0]].owner):
                    host.release(kernel.replicas[session[0]].owner)
            entry.session_gpus = None
            for r in replicas:
                entry.replicas.pop(r.replica_id, None)
                if kernel is not None and r.replica_id in kernel.replicas:
                    self.cluster.remove_replica(kernel_id, r.replica_id)
            if kernel is not None:
                kernel.executor = None
            entry.checkpoint_count = max(entry.checkpoint_count, count)
            entry.pending_stops = [(r.host_id, r.replica_id) for r in replicas]
            if entry.front is not None:
                entry.front.set_replicas([])
            idle_s = time.monotonic() - entry.last_active
            entry.state = "hibernated"
            entry.hibernated_unix = time.time()
            entry.message = (f"hibernated after {idle_s:.0f} s without a cell; its state is the "
                             f"checkpoint after cell [{count}]; the next cell wakes it")
            self._save_kernel(entry)
        if session is not None:
            link = self.hosts.get(session[1])
            if link is not None:
                link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
                    kernel_id=kernel_id, replica_id=session[0], all_requests=True))
            self._gpus_released()
        self._finish_pending_stops(entry)
        self.metrics.hibernations.inc()
        log.info("kernel %s: hibernated (%d replicas stopped in %.2f s)", kernel_id,
                 len(replicas), time.monotonic() - started)

    def _still_hibernating(self, entry: KernelEntry) -> bool:
        """Whether the hibernation under way is still this kernel's (lock held). When another
        change took the kernel over meanwhile (a stop, a cell, a wake), the idle clock is set
        again for a kernel left awake: a hibernation that gave up without it never came back
        (the fault campaign, seed 14: awake for two minutes, nothing in the log)."""
        if entry.state == "hibernating" and self.kernels.get(entry.kernel_id) is entry:
            return True
        if self.kernels.get(entry.kernel_id) is entry and entry.state in ("idle", "degraded"):
            self._active(entry)
        return False

    def _stay_awake(self, entry: KernelEntry, message: str) -> None:
        """A hibernation gives up (lock held): the kernel is awake again with the replicas it
        has (any it lost meanwhile replaced: recovery leaves a hibernating kernel alone), and
        its idle clock starts over."""
        whole = len(entry.replicas) >= self.replicas_per_kernel
        entry.state = "idle" if whole else "degraded"
        entry.message = message
        self._save_kernel(entry)
        if not whole:
            self._restore_replica_count(entry.kernel_id)  # a task on the loop
        self._active(entry)

    def _background_work(self, entry: KernelEntry) -> list[str]:
        """What the kernel's replicas report their cells left running (a thread, a process:
        kernel/background_work.py), each phrase with its replica; a replica that does not
        answer reports nothing (it has nothing to lose here that a failover would keep)."""
        with self.lock:
            replicas = list(entry.replicas.values())
        running: list[str] = []
        for replica in replicas:
            try:
                status = control_request(replica.endpoint, entry.key, entry.signature_scheme,
                                         "replica_status_request", {}, timeout_s=5)
            except ControlError:
                continue
            running += [f"{work} on replica {replica.replica_id}"
                        for work in status.get("background_work") or ()]
        return running

    def _checkpoint_writer(self, entry: KernelEntry, guess):  # noqa: ANN001, ANN202 - ReplicaLink
        """The replica that ran the kernel's last cell, as the Raft log says (it writes the
        checkpoint; another replica may have taken a cell over from the one the scheduler
        chose); ``guess`` when that cannot be asked."""
        try:
            status = control_request(guess.endpoint, entry.key, entry.signature_scheme,
                                     "replica_status_request", {}, timeout_s=5)
        except ControlError:
            return guess
        with self.lock:
            return entry.replicas.get(int(status.get("last_executor") or 0)) or guess

    def _finish_pending_stops(self, entry: KernelEntry) -> None:
        """Stop the replicas hibernation stopped (again: a stop of a gone one is a no-op), and
        forget them once done. Before a wake: a host refuses a second replica of a kernel."""
        with self.lock:
            pending = list(entry.pending_stops)
        for host_id, replica_id in pending:
            self._stop_replica_quietly(host_id, entry.kernel_id, replica_id)
        with self.lock:
            entry.pending_stops = [p for p in entry.pending_stops if p not in pending]
            if pending and self.kernels.get(entry.kernel_id) is entry:
                self._save_kernel(entry)

    # -- waking ---------------------------------------------------------------------------------

    def wake_kernel(self, kernel_id: str) -> bool:
        """Start waking a hibernated kernel, for a thread: the decision under the lock, the wake
        itself a task on the fronts' loop (``_start_wake``); False when it is not asleep."""
        with self.lock:
            waking = self._begin_wake(kernel_id)
        if waking:
            FrontLoop.shared().call(lambda: self._start_wake(kernel_id))
        return waking

    def _begin_wake(self, kernel_id: str) -> bool:
        """The decision to wake the kernel: it is hibernated, and now waking (the wake itself,
        ``_wake``, is the caller's to start on the loop, ``_start_wake``, once the lock is let
        go). Lock held."""
        entry = self.kernels.get(kernel_id)
        if entry is None or entry.state != "hibernated":
            return False
        entry.state = "waking"
        entry.wake_started = time.monotonic()
        entry.wake_error = ""
        self._save_kernel(entry)
        return True

    def _start_wake(self, kernel_id: str) -> None:
        """Run ``_wake`` as a task on the running loop (the caller's: WakeKernel, a cell's
        wait for its kernel's replicas) that nobody awaits; a failure other than the wake's
        own is logged."""
        background.spawn(self._wake(kernel_id), self._effects)

    async def _wake(self, kernel_id: str) -> None:
        """The wake, a coroutine on the loop: the decisions under the lock, awaited; the
        replicas hibernation stopped stopped again in the ``gs-work`` pool, and the new ones
        started from the checkpoint by ``_add_replicas`` (its wait for them to answer
        holds no thread)."""
        async with self._locked():
            entry = self.kernels.get(kernel_id)
            if entry is None or entry.state != "waking":
                return
            restore = entry.checkpoint_count > 0
            expected = entry.checkpoint_count
        await self._pool.run(self._finish_pending_stops, entry)
        try:
            await self._add_replicas(
                kernel_id, self.replicas_per_kernel, join=False, restore=restore,
                extra_env={"NOTEBOOKOS_RESTORED_FOR": "hibernation",
                           "NOTEBOOKOS_RESTORE_EXPECTED": str(expected)})
        except StartError as exc:
            async with self._locked():
                entry.state = "hibernated"
                entry.wake_error = str(exc)
                entry.message = f"could not wake: {exc}; the next cell tries again"
                self._save_kernel(entry)
            self.metrics.wakes.labels(outcome="failed").inc()
            log.warning("kernel %s: could not wake: %s", kernel_id, exc)
            return
        async with self._locked():
            took = time.monotonic() - entry.wake_started
            entry.state = "idle"
            entry.last_wake_s = took
            entry.message = f"woke from hibernation in {took:.1f} s"
            self._save_kernel(entry)
            self._active(entry)
        self.metrics.wakes.labels(outcome="succeeded").inc()
        self.metrics.wake_time.observe(took)
        log.info("kernel %s: woke from hibernation in %.2f s", kernel_id, took)
