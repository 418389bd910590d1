"""The replay engine: every session of a plan played against Jupyter Server on one event loop.

One coroutine per session: it opens the session at its start time (``POST /api/sessions`` with
the kernelspec that asks for its GPUs), keeps one kernel websocket, sends each cell at its
submit time (a cell sent while the previous one runs queues in the kernel, as it would for a
user), keeps the session open while it is idle, and closes it at its stop time once its cells
are done. Another coroutine samples the cluster (the NotebookOS server extension) to integrate
the GPUs it committed. A cell that never answers, a kernel that dies or a session that cannot
start is recorded as a failure with its reason, and the run goes on. Cancelling the run
(Ctrl-C) stops every session and keeps what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from notebookos.policies import PolicyKind, policy_class
from notebookos.replay.cells import cell_code
from notebookos.replay.jupyter import Execution, JupyterServer, KernelChannel, ServerError
from notebookos.replay.plan import kernel_gpus, session_stop
from notebookos.replay.records import (
    COMPLETED,
    FAILED,
    NOT_SUBMITTED,
    RunResult,
    SessionResult,
    TaskResult,
)
from notebookos.workload.model import Session, Task, Workload

log = logging.getLogger(__name__)

# Keys of the scheduler's reply metadata (metadata.notebookos) that say a cell waited for GPUs.
_WAIT_KEYS = ("waited", "waited_for", "queued", "wait_reason", "migrated")
_DELAY_KEYS = ("interactivity_delay_s", "interactivity_delay_ms")


def containers_per_cell(policy: str) -> bool:
    """Whether the policy runs a fresh container per cell (its lifetime strategy says so: batch,
    lcp, or a plug-in of that kind), where a cell on another host than the last is no migration.
    False for a name that is not an installed session policy."""
    try:
        cls = policy_class(policy)
    except ValueError:
        return False
    return cls.kind is PolicyKind.SESSION and cls().lifetime.per_cell


@dataclass(frozen=True)
class ReplayOptions:
    work: str = "sleep"
    cell_timeout_s: float = 120.0  # beyond the cell's own duration (and the queue before it)
    immediate_threshold_s: float = 1.0
    sample_interval_s: float = 0.5
    idle_grace_s: float = 5.0  # after the reply, wait this long for idle and the cell's output
    stop_timeout_s: float = 60.0
    seed: int = 0
    policy: str = ""


class Replay:
    def __init__(self, server: JupyterServer, workload: Workload, options: ReplayOptions,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.server = server
        self.workload = workload
        self.options = options
        self.on_progress = on_progress
        self.per_cell = containers_per_cell(options.policy)
        self.kernelspecs: dict[int, str] = {}
        self.tasks: dict[str, TaskResult] = {}
        self.sessions: dict[str, SessionResult] = {}
        self.t0 = 0.0
        self.open_sessions = 0
        self.done_tasks = 0
        self.replica_hosts: dict[str, dict[int, str]] = {}  # kernel id -> replica id -> host
        self.cluster_moves = 0
        self.samples: list[tuple] = []
        for s in workload.sessions:
            for i, t in enumerate(s.tasks):
                self.tasks[t.task_id] = TaskResult(t.task_id, s.session_id, i, t.gpus, t.submit,
                                                   t.duration)

    # -- helpers -------------------------------------------------------------------------------

    def now(self) -> float:
        return time.time() - self.t0

    async def _sleep_until(self, when: float) -> None:
        delay = when - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress({"open_sessions": self.open_sessions, "done": self.done_tasks,
                              "elapsed_s": self.now()})

    # -- the run ---------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Find the server's NotebookOS kernelspecs (one per GPU count)."""
        specs = await self.server.notebookos_kernelspecs()
        if not specs:
            raise ServerError("the Jupyter Server offers no NotebookOS kernelspec "
                              "(notebookos kernelspec install)")
        self.use_kernelspecs(specs)

    def use_kernelspecs(self, specs: dict[str, Any]) -> None:
        """name -> request (a ResourceSpec): the first name (sorted) per GPU count is used."""
        for name, spec in sorted(specs.items(), key=lambda kv: (kv[1].gpus, kv[0])):
            self.kernelspecs.setdefault(spec.gpus, name)

    async def run(self) -> RunResult:
        """Play the whole plan; cancel the task that awaits this to stop early."""
        if not self.kernelspecs:
            await self.prepare()
        started = time.monotonic()
        self.t0 = time.time()
        sampler = asyncio.create_task(self._sample_cluster())
        runners = [asyncio.create_task(self._run_session(s)) for s in self.workload.sessions]
        interrupted = False
        stopped_at: float | None = None
        try:
            # asyncio.wait, not gather: cancelling this run must not cancel the runners behind
            # our back (gather would, then report the first one that finished closing, and a
            # second cancel would cut the others' closing short, leaving their sessions open).
            await asyncio.wait(runners)
        except asyncio.CancelledError:
            interrupted, stopped_at = True, self.now()
            for runner in runners:
                runner.cancel()  # once: each closes its session in its own finally
            deadline = time.monotonic() + self.options.stop_timeout_s + 5.0
            pending = {r for r in runners if not r.done()}
            while pending and time.monotonic() < deadline:
                try:
                    _, pending = await asyncio.wait(pending,
                                                    timeout=deadline - time.monotonic())
                except asyncio.CancelledError:
                    continue  # another Ctrl-C: the sessions are being closed already
        finally:
            sampler.cancel()
            with contextlib.suppress(BaseException):
                await sampler
        end = self.now()
        for task in self.tasks.values():
            if task.status == NOT_SUBMITTED and interrupted:
                if task.submit_s is None:
                    task.reason = "the replay was stopped before this cell's time"
                else:
                    task.status = FAILED
                    task.reason = "the replay was stopped while this cell ran"
        return RunResult(list(self.tasks.values()), list(self.sessions.values()),
                         samples=self.samples, cluster_migrations=self.cluster_moves,
                         interrupted=interrupted, stopped_at_s=stopped_at,
                         wall_s=time.monotonic() - started, end_s=end)

    async def _sample_cluster(self) -> None:
        while True:
            doc = await self.server.notebookos_cluster()
            if doc is not None:
                gpus = doc.get("gpus") or {}
                self.samples.append((round(self.now(), 4), len(doc.get("hosts") or []),
                                     gpus.get("total"), gpus.get("committed"), gpus.get("pending"),
                                     len(doc.get("kernels") or []),
                                     doc.get("subscription_ratio_limit")))
                for kernel in doc.get("kernels") or []:
                    self._note_replicas(kernel)
                    self._note_ready(kernel)
            self._progress()  # the elapsed time moves on between cells too
            await asyncio.sleep(self.options.sample_interval_s)

    def _note_ready(self, kernel: dict[str, Any]) -> None:
        """A session's kernel is ready once the cluster reports it past ``starting``; a kernel
        the cluster reports ``failed`` fails its session, with the cluster's reason, even if no
        cell of it is due (an idle session whose kernel never started holds nothing)."""
        state = kernel.get("state")
        if state in (None, "", "starting", "unspecified"):
            return
        for session in self.sessions.values():
            if session.kernel_id != kernel.get("id") or session.stopped_s is not None:
                continue
            if state == "failed":
                session.failure = session.failure or (
                    f"the cluster reports the kernel failed at {self.now():.1f} s: "
                    f"{kernel.get('message') or 'no reason given'}")
            elif session.ready_s is None and state not in ("stopping", "stopped"):
                session.ready_s = self.now()

    def _note_replicas(self, kernel: dict[str, Any]) -> None:
        """Count replica moves (a replica id seen on another host than before)."""
        now = {int(r["replica_id"]): r["host_id"] for r in kernel.get("replicas") or []
               if r.get("host_id")}
        before = self.replica_hosts.get(kernel["id"])
        if before is not None:
            self.cluster_moves += sum(1 for rid, host in now.items()
                                      if rid in before and before[rid] != host)
        self.replica_hosts[kernel["id"]] = {**(before or {}), **now}

    # -- one session ----------------------------------------------------------------------------

    async def _run_session(self, s: Session) -> None:
        gpus = kernel_gpus(s.request.gpus, list(self.kernelspecs))
        name = self.kernelspecs[gpus]
        result = SessionResult(s.session_id, gpus, name, s.start, session_stop(s), len(s.tasks))
        self.sessions[s.session_id] = result
        await self._sleep_until(s.start)
        channel: KernelChannel | None = None
        waiters: list[asyncio.Task] = []
        try:
            result.start_requested_s = self.now()
            try:
                result.jupyter_session, result.kernel_id = await self.server.start_session(
                    f"notebookos-replay/{s.session_id}.ipynb", name)
                result.started_s = self.now()
                self.open_sessions += 1
                channel = await self.server.connect(result.kernel_id)
            except (ServerError, KeyError, TypeError) as exc:
                result.failure = f"the session could not start: {exc}"
                for t in s.tasks:
                    self._fail_unsent(t, result.failure)
                return
            before = await self._replica_hosts(result.kernel_id)
            previous: _Sent | None = None
            for t in s.tasks:
                await self._sleep_until(t.submit)
                channel = await self._usable_channel(channel, result)
                if channel is None:
                    self._fail_unsent(t, result.failure)
                    continue
                expected = self._expected_previous(s, t)
                execution = await channel.execute(cell_code(
                    self.options.work, s.session_id, self.tasks[t.task_id].index, t.duration,
                    expected, self.options.seed))
                record = self.tasks[t.task_id]
                record.submit_s = execution.submitted - self.t0
                deadline = max(self.now(), previous.deadline if previous else 0.0) \
                    + t.duration + self.options.cell_timeout_s
                sent = _Sent(t, execution, deadline)
                waiters.append(asyncio.create_task(self._finish(result, sent, previous, before)))
                previous = sent
            if waiters:
                await asyncio.gather(*waiters)
            await self._sleep_until(session_stop(s))
        finally:
            for waiter in waiters:
                waiter.cancel()
            if channel is not None:
                await channel.close()
            if result.jupyter_session:
                await _uncancellable(self._stop_session(result))  # bounded by stop_timeout_s

    async def _stop_session(self, result: SessionResult) -> None:
        try:
            await asyncio.wait_for(self.server.stop_session(result.jupyter_session),
                                   self.options.stop_timeout_s)
            result.stopped_s = self.now()
        except (TimeoutError, ServerError) as exc:
            result.failure = result.failure or f"closing the session failed: {exc}"
            result.stopped_s = self.now()
        finally:
            self.open_sessions -= 1
            self._progress()

    async def _usable_channel(self, channel: KernelChannel | None,
                              result: SessionResult) -> KernelChannel | None:
        """The session's websocket, reconnected once if it closed while the kernel lives on."""
        if channel is not None and not channel.closed_reason:
            return channel
        if result.failure:
            return None
        reason = channel.closed_reason if channel is not None else "no websocket"
        if await self.server.kernel_alive(result.kernel_id):
            with contextlib.suppress(ServerError):
                return await self.server.connect(result.kernel_id)
        result.failure = f"the kernel is gone ({reason})"
        return None

    def _expected_previous(self, s: Session, t: Task) -> int | None:
        """The cell whose state this one should see: the last earlier cell that completed or is
        still running (assumed to complete; checked again when this one's marker arrives)."""
        index = self.tasks[t.task_id].index
        for earlier in reversed(s.tasks[:index]):
            record = self.tasks[earlier.task_id]
            if record.status == COMPLETED or (record.status == NOT_SUBMITTED
                                              and record.submit_s is not None):
                return record.index
        return None

    def _fail_unsent(self, t: Task, reason: str) -> None:
        record = self.tasks[t.task_id]
        record.status, record.reason = FAILED, reason
        record.submit_s = self.now()
        self.done_tasks += 1
        self._progress()

    async def _replica_hosts(self, kernel_id: str) -> dict[int, str]:
        doc = await self.server.notebookos_kernel(kernel_id)
        if doc is None:
            return {}
        return {int(r["replica_id"]): r["host_id"] for r in doc.get("replicas") or []
                if r.get("host_id")}

    async def _finish(self, result: SessionResult, sent: _Sent, previous: _Sent | None,
                      before: dict[int, str]) -> None:
        """Wait for one cell's reply (or its deadline) and record it. Cells of a session are
        recorded in order, so the state check of a cell knows how its predecessors ended."""
        if previous is not None:
            await previous.recorded.wait()
        record = self.tasks[sent.task.task_id]
        execution = sent.execution
        try:
            timeout = max(0.0, sent.deadline - self.now())
            try:
                await asyncio.wait_for(execution.done.wait(), timeout)
            except TimeoutError:
                self._record_execution(record, execution)  # what did arrive (execute_input?)
                record.status = FAILED
                record.reason = (f"no reply within {sent.deadline - record.submit_s:.1f} s "
                                 "(the cell was interrupted)")
                with contextlib.suppress(ServerError):
                    await self.server.request(
                        "POST", f"/api/kernels/{result.kernel_id}/interrupt")
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(execution.settled.wait(), self.options.idle_grace_s)
            self._record_execution(record, execution)
            if record.status == COMPLETED or execution.reply is not None:
                await self._record_placement(record, result, before)
        finally:
            self.done_tasks += 1
            sent.recorded.set()
            self._progress()

    def _record_execution(self, record: TaskResult, execution: Execution) -> None:
        t0 = self.t0
        asked = min(record.planned_submit_s, execution.submitted - t0)  # the user's moment
        if execution.execute_input is not None:
            record.execute_input_s = execution.execute_input - t0
            record.interactivity_s = record.execute_input_s - asked
            record.wire_delay_s = execution.execute_input - execution.submitted
        if execution.reply_at is not None:
            record.reply_s = execution.reply_at - t0
            record.tct_s = record.reply_s - asked
        if execution.idle is not None:
            record.idle_s = execution.idle - t0
        record.starts = execution.starts
        marker = execution.marker or {}
        if marker:
            record.work_start_s = float(marker["t_start"]) - t0
            record.work_end_s = float(marker["t_end"]) - t0
            record.state_seen = marker.get("seen")
            record.device = str(marker.get("device") or "")
            record.moved_by_kernel = marker.get("moved_by_kernel")
            gpus = marker.get("gpus")
            record.gpu_device_ids = "+".join(str(g) for g in gpus) if gpus else ""
        meta = execution.reply_metadata.get("notebookos") or {}
        if isinstance(meta.get("executor"), int):
            record.executor_replica = meta["executor"]
        elif isinstance(meta.get("replica_id"), int):
            record.executor_replica = meta["replica_id"]
        if isinstance(meta.get("host_id"), str):
            record.executor_host = meta["host_id"]
        for key in _DELAY_KEYS:
            if isinstance(meta.get(key), int | float):
                scale = 0.001 if key.endswith("_ms") else 1.0
                record.scheduler_delay_s = float(meta[key]) * scale
        reply = execution.reply
        if execution.lost and reply is None:
            record.status, record.reason = FAILED, execution.lost
        elif reply is None:
            record.status, record.reason = FAILED, "no reply"
        elif reply.get("status") != "ok":
            record.status = FAILED
            record.reason = f"{reply.get('ename', reply.get('status'))}: " \
                            f"{str(reply.get('evalue', ''))[:300]}"
        elif not marker:
            record.status = FAILED
            record.reason = "the cell replied ok but its output never arrived" + (
                f" (stderr: {execution.stderr[-200:]})" if execution.stderr else "")
        else:
            record.status = COMPLETED
            # The cell checked its state against the predecessor expected when it was sent;
            # that one may have failed since (its state discarded), so judge the index seen by
            # how the earlier cells really ended, and the rest by the cell's own consistency.
            consistent = marker.get("consistent", marker.get("state_ok"))
            record.state_ok = bool(consistent) and \
                record.state_seen == self._last_completed_before(record)
            if not record.state_ok:
                record.reason = (f"state check: expected the state of cell "
                                 f"{self._last_completed_before(record)}, saw {record.state_seen}")
        if not record.gpu_device_ids and isinstance(meta.get("gpu_device_ids"), list):
            record.gpu_device_ids = "+".join(str(g) for g in meta["gpu_device_ids"])
        waited = any(bool(meta.get(k)) for k in _WAIT_KEYS) or (
            isinstance(meta.get("waited_ms"), int | float) and meta["waited_ms"] > 0)
        if record.interactivity_s is not None:
            record.immediate = not waited and \
                record.interactivity_s <= self.options.immediate_threshold_s
        if record.starts > 1:
            record.reason = (f"{record.reason}; " if record.reason else "") + (
                f"its code started {record.starts} times (execute_input): the cluster ran it "
                "again")

    def _last_completed_before(self, record: TaskResult) -> int | None:
        done = [t.index for t in self.tasks.values() if t.session_id == record.session_id
                and t.index < record.index and t.status == COMPLETED]
        return max(done) if done else None

    async def _record_placement(self, record: TaskResult, result: SessionResult,
                                before: dict[int, str]) -> None:
        """Executor host and migration, from the extension's view of the kernel after the cell.
        ``before`` (the replicas' hosts after the previous cell) is updated in place."""
        doc = await self.server.notebookos_kernel(result.kernel_id)
        if doc is None:
            return
        hosts = {int(r["replica_id"]): r["host_id"] for r in doc.get("replicas") or []
                 if r.get("host_id")}
        last = doc.get("last_cell_gpus") or {}
        if record.executor_replica is None and isinstance(doc.get("executor"), int):
            record.executor_replica = doc["executor"]
        if not record.executor_host:
            record.executor_host = last.get("host_id") or hosts.get(
                record.executor_replica if record.executor_replica is not None else -1, "")
        if not record.gpu_device_ids and last.get("device_ids"):
            record.gpu_device_ids = "+".join(str(g) for g in last["device_ids"])
        if record.scheduler_delay_s is None and doc.get("last_interactivity_delay_ms"):
            record.scheduler_delay_s = float(doc["last_interactivity_delay_ms"]) / 1000
        if before and record.executor_host and not self.per_cell \
                and record.executor_host not in before.values():
            record.migrated = True
            record.immediate = False
        if hosts:
            before.clear()
            before.update(hosts)


async def _uncancellable(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile (then re-raise)."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


@dataclass
class _Sent:
    """A cell sent on a session's websocket; ``recorded`` is set once its result is final."""

    task: Task
    execution: Execution
    deadline: float
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
