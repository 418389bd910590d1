"""The execute router: a front's ``execute_request`` from its arrival to its executor.

``hooks.place_execute_async`` picks the executor and commits its GPUs: a task on the loop (it
may wait for GPUs, for CommitGpus, for a migration; a stand-in's blocking ``place_execute``
runs on a thread of the placement pool), one cell at a time and in order, so the loop keeps
routing everything else meanwhile; an interrupt withdraws the cells
not sent yet (an ``aborted`` reply each). The executor gets ``execute_request`` with
``metadata.gpu_device_ids``, every other replica gets ``yield_request``; each copy is re-signed
with the kernel key. When the executor is the replica that ran the previous cell, its
committed LEAD decides the election alone, so the ``yield_request`` copies are held back for
``yield_hold_s``: a short cell finishes without them (two fewer requests and replies on the
critical path, and two replicas left idle). They go out when the hold ends, or at once when the
executor's replica is dropped, so for a longer cell, or a lost executor, the standbys watch the
election exactly as before. A cell no replica ran (every one yielded) is placed again under a
new id (``_retry_id``), up to ``MAX_RESUBMISSIONS`` times.

Mixed into ``KernelFront``; what the replicas answer is the reply merger's (front_replies.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from notebookos.global_scheduler.front_hooks import PlacementFailed, call_optional
from notebookos.global_scheduler.front_requests import (
    MAX_RESUBMISSIONS,
    _Pending,
    _retry_id,
    _Waiting,
)
from notebookos.global_scheduler.placement_worker import PlacementPool

log = logging.getLogger(__name__)

# How long a sticky executor's cell runs before the standbys get their yield_request: longer than
# a trivial cell, far shorter than the replicas' own election timeouts (docs/kernel-protocol.md).
YIELD_HOLD_S = 0.2


class ExecuteRouter:
    def _init_execute(self) -> None:
        # Execute requests are placed one at a time, in the order they came, each on a thread
        # of the placement pool (placement may wait for GPUs): ``_placing`` is the one placed.
        self._waiting: deque[_Waiting] = deque()
        self._placing: _Waiting | None = None
        self._placer = PlacementPool.shared()
        self._arrivals: OrderedDict[str, float] = OrderedDict()  # client msg_id -> monotonic
        # What each cell waited for before it was sent to its executor (client msg_id ->
        # {what: why}, in order): the replicas starting, GPUs, a migration. The reply says so.
        self._waited_for: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._aliases: OrderedDict[str, dict] = OrderedDict()  # resubmitted id -> client header
        self.preferred_replica: int | None = None
        self.yield_hold_s = YIELD_HOLD_S
        self._holding: dict[str, _Pending] = {}  # execute requests whose yields are held back
        self._epoch = os.urandom(4).hex()  # this instance, in what it sends the replicas
        self._requests_seen: OrderedDict[str, str] = OrderedDict()  # msg_id -> session|date
        self._renamed = 0

    def withdraw_waiting(self, why: str = "the kernel was interrupted") -> None:
        """Answer every execute request not sent to a replica yet with ``aborted`` (an
        interrupt while cells wait for GPUs); thread-safe."""
        self._run_on_loop(lambda: self._withdraw_waiting(why))

    def cell_waiting(self, msg_id: str, why: str) -> None:
        """The scheduler cannot place the cell ``msg_id`` now and keeps trying: tell the
        client (a note on stderr, in the cell's output) why it waits; thread-safe."""
        def apply() -> None:
            waiting = self._placing
            if waiting is None or waiting.msg_id != msg_id or waiting.withdrawn:
                return
            first = not waiting.wait_reason
            waiting.wait_reason = why
            self._note_wait(waiting.msg, "GPUs", why)
            if first:
                self._send_note(why, waiting.msg)

        self._run_on_loop(apply)

    def cell_note(self, msg_id: str, text: str) -> None:
        """A note on stderr in the output of the cell ``msg_id`` while the scheduler places it
        (``NotebookOS: the notebook woke from hibernation in 1.2 s``); thread-safe."""
        def apply() -> None:
            waiting = self._placing
            if waiting is not None and waiting.msg_id == msg_id and not waiting.withdrawn:
                self._send_note(text, waiting.msg)

        self._run_on_loop(apply)

    def cell_migrating(self, msg_id: str, why: str) -> None:
        """The scheduler moves a replica to another host to run the cell ``msg_id``: the client
        is told (a note on stderr, once per cell: a migration takes seconds) and the reply
        will say it waited for a migration, and why; thread-safe."""
        def apply() -> None:
            waiting = self._placing
            if waiting is None or waiting.msg_id != msg_id or waiting.withdrawn:
                return
            first = "migration" not in self._waited_for.get(
                waiting.msg["header"].get("msg_id", ""), {})
            self._note_wait(waiting.msg, "migration", why)
            if first:
                self._send_note(why, waiting.msg)

        self._run_on_loop(apply)

    def _note_wait(self, request: dict, what: str, why: str) -> None:
        key = request["header"].get("msg_id", "")
        causes = self._waited_for.get(key)
        if causes is None:
            causes = {}
            self._remember(self._waited_for, key, causes)
        causes.setdefault(what, why)

    def _election_id(self, msg: dict) -> str:
        """The id a client's execute request runs under: its msg_id, unless an earlier request
        of a different session or time came with the same one. jupyter_client numbers the
        msg_ids of a session's clones from 0 again, so two clients of one KernelManager send
        the same ids; the replicas run one election per id, so the second cell would never
        run. A reused id gets a fresh one (the client sees its own in every reply)."""
        header = msg["header"]
        msg_id = str(header.get("msg_id", ""))
        fingerprint = f"{header.get('session')}|{header.get('date')}"
        seen = self._requests_seen.get(msg_id)
        self._remember(self._requests_seen, msg_id, fingerprint)
        if seen is None or seen == fingerprint:
            return msg_id
        self._renamed += 1
        renamed = f"{msg_id}~{self._epoch}.{self._renamed}"
        log.info("kernel %s: msg_id %s reused by another request; it runs as %s",
                 self.kernel_id, msg_id, renamed)
        self._arrivals.pop(msg_id, None)  # the earlier request's arrival
        return renamed

    def _route_execute(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int) -> None:
        """Queue ``msg`` (the client's request) for placement under ``msg_id``: the client's own
        id first, a fresh one for a resubmission after every replica yielded (a failed election
        never reruns), which goes before the cells queued behind it."""
        client_msg_id = msg["header"].get("msg_id", "")
        arrived = self._arrivals.get(client_msg_id)  # held while the replicas started, a retry
        if arrived is None:
            arrived = time.monotonic()
            self._remember(self._arrivals, client_msg_id, arrived)
        waiting = _Waiting(idents, msg, msg_id, attempt, arrived)
        if attempt > 0:
            self._waiting.appendleft(waiting)
        else:
            self._waiting.append(waiting)
        self._place_next()

    def _place_next(self) -> None:
        """Place the next queued cell on a thread of the placement pool (placement can wait for
        GPUs, a CommitGpus call or a migration); the loop sends it when placed, in queue
        order."""
        if self._placing is not None or not self._waiting:
            return
        waiting = self._placing = self._waiting.popleft()
        metadata = dict(waiting.msg.get("metadata") or {})
        log.debug("kernel %s: placing %s (attempt %d, %d queued behind)", self.kernel_id,
                  waiting.msg_id[:8], waiting.attempt, len(self._waiting))

        self._place(waiting.msg_id, metadata,
                    lambda result: self._placement_done(waiting, result))

    def _place(self, msg_id: str, metadata: dict, deliver: Callable[[Any], None]) -> None:
        """Place the cell ``msg_id``; ``deliver`` gets (executor, device ids) or the
        PlacementFailed, on the loop. A service's ``place_execute_async`` runs as a task on
        the loop and holds no thread while it waits; a stand-in's blocking ``place_execute``
        runs on a thread of the placement pool."""
        place_async = getattr(self.hooks, "place_execute_async", None)
        if self._started and place_async is not None:
            assert self._loop is not None
            # on the loop (the front's own routing), a task; else through the thread-safe hop
            future: Any = (self._loop.task if self._loop.on_loop() else self._loop.spawn)(
                place_async(self.kernel_id, msg_id, metadata))
            future.add_done_callback(
                lambda done: self._run_on_loop(lambda: deliver(self._outcome(msg_id, done))))
            return

        def place() -> None:
            try:
                result: Any = self.hooks.place_execute(self.kernel_id, msg_id, metadata)
            except PlacementFailed as exc:
                result = exc
            except Exception as exc:  # noqa: BLE001 - the client must get an answer
                log.exception("kernel %s: placing %s failed", self.kernel_id, msg_id)
                result = PlacementFailed(f"placing the cell failed: {exc}")
            self._run_on_loop(lambda: deliver(result))

        if not self._started:
            place()  # no loop to keep free (a front used without start())
        else:
            self._placer.submit(place)

    def _outcome(self, msg_id: str, done: concurrent.futures.Future | asyncio.Task) -> Any:
        """What a finished placement task gives the front: its result, or a PlacementFailed
        that says why."""
        if done.cancelled():
            return PlacementFailed("the Global Scheduler is stopping")
        exc = done.exception()
        if exc is None:
            return done.result()
        if isinstance(exc, PlacementFailed):
            return exc
        log.error("kernel %s: placing %s failed", self.kernel_id, msg_id, exc_info=exc)
        return PlacementFailed(f"placing the cell failed: {exc}")

    def _placement_done(self, waiting: _Waiting, result: Any) -> None:
        if self._placing is waiting:
            self._placing = None
        placed = not isinstance(result, PlacementFailed)
        if waiting.withdrawn or self._stop.is_set():
            if placed:  # its GPUs were committed meanwhile: give them back
                self.hooks.release_execute(self.kernel_id, waiting.msg_id)
            return
        if placed:
            executor, device_ids = result
            waiting.placed_at = time.monotonic()
            self._send_execute(waiting.idents, waiting.msg, waiting.msg_id, waiting.attempt,
                               executor, device_ids)
            pending = self._pending.get(waiting.msg_id)
            if pending is not None:
                pending.placement = waiting
        else:
            log.info("kernel %s: cell %s not placed: %s", self.kernel_id, waiting.msg_id[:8],
                     result)
            self._reply_error("shell", waiting.idents, waiting.msg, "NotebookOSNoGPUs",
                              str(result))
        self._place_next()

    def _withdraw_waiting(self, why: str) -> int:
        """Every execute request not sent to a replica yet (held while the replicas start,
        queued, or being placed) gets an ``aborted`` reply and never runs; returns how many."""
        withdrawn = list(self._waiting)
        self._waiting.clear()
        placing, self._placing = self._placing, None
        if placing is not None:
            withdrawn.insert(0, placing)
            # stop waiting for GPUs for it
            call_optional(self.hooks, "cancel_execute", self.kernel_id, placing.msg_id)
        kept: deque[tuple[str, list[bytes], dict, list[bytes]]] = deque()
        for held in self._held_requests:
            channel, idents, msg, _ = held
            if channel == "shell" and msg["header"].get("msg_type") == "execute_request":
                withdrawn.append(_Waiting(idents, msg, msg["header"].get("msg_id", ""), 0))
            else:
                kept.append(held)
        self._held_requests = kept
        for waiting in withdrawn:
            waiting.withdrawn = True
            self._reply_aborted(waiting, why)
        if withdrawn:
            log.info("kernel %s: %s; withdrew %d waiting cell(s)", self.kernel_id, why,
                     len(withdrawn))
        return len(withdrawn)

    def _reply_aborted(self, waiting: _Waiting, why: str) -> None:
        """busy, a note on stderr, ``execute_reply`` with status ``aborted``, idle."""
        parent, msg = waiting.msg, self.session.msg
        waited_ms = round((time.monotonic() - waiting.arrived) * 1000)
        self._send_iopub(msg("status", {"execution_state": "busy"}, parent=parent),
                         b"kernel.notebookos.status")
        note = (f"NotebookOS: {why} while this cell waited to run ({waited_ms / 1000:.1f} s); "
                "it was withdrawn and did not run.\n")
        self._send_iopub(msg("stream", {"name": "stderr", "text": note}, parent=parent),
                         b"kernel.notebookos.stream")
        metadata = {"notebookos": {"withdrawn": True, "reason": why, "waited_ms": waited_ms}}
        self._reply("shell", self.session.serialize(
            msg("execute_reply", {"status": "aborted", "execution_count": None},
                parent=parent, metadata=metadata), ident=waiting.idents))
        self._send_iopub(msg("status", {"execution_state": "idle"}, parent=parent),
                         b"kernel.notebookos.status")

    def _send_execute(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int,
                      executor: int, device_ids: list[int]) -> None:
        """The request is placed on ``executor`` with ``device_ids`` committed: send it."""
        self._apply_commands()  # a migration may just have connected a new replica
        if executor not in self._replicas:
            # Lost between its placement and now (SIGKILLed just before the cell came): the
            # cell never reached a replica, so it is placed again, on the replicas left.
            self.hooks.release_execute(self.kernel_id, msg_id)
            if attempt < MAX_RESUBMISSIONS:
                retry_id = _retry_id(msg_id, attempt + 1)
                log.info("kernel %s: replica %d chosen for %s is gone; placing it again as %s",
                         self.kernel_id, executor, msg["header"].get("msg_id", ""), retry_id)
                self._route_execute(idents, msg, retry_id, attempt + 1)
                return
            self._reply_error("shell", idents, msg, "NotebookOSNoGPUs",
                              f"replica {executor} chosen for the cell is not connected "
                              f"(after {attempt + 1} placements)")
            return
        sticky = executor == self.preferred_replica  # it ran the previous cell here
        self.preferred_replica = executor
        client_msg_id = msg["header"]["msg_id"]
        if msg_id != client_msg_id:
            self._remember(self._aliases, msg_id, msg["header"])
        standbys = sorted(set(self._replicas) - {executor})
        log.debug("kernel %s: %s -> execute on replica %d (GPUs %s), yield on %s%s",
                  self.kernel_id, msg_id[:8], executor, device_ids, standbys,
                  " (held)" if sticky else "")
        pending = _Pending("shell", idents, "execute_request", executor, asked={executor},
                           client_msg=msg, client_msg_id=client_msg_id, attempt=attempt,
                           gpu_device_ids=list(device_ids))
        self._pending[msg_id] = pending
        if msg_id not in self._source_seen:  # a resent cell that already runs keeps its source
            self._remember(self._iopub_source, msg_id, executor)
        if (msg.get("content") or {}).get("allow_stdin"):
            self._replica_socket(executor, "stdin")  # its input_request has a way back
        self.session.send(self._replica_socket(executor, "shell"),
                          self._elected_copy(msg, msg_id, executor, device_ids, self._epoch))
        pending.held_yields = standbys
        if sticky and self.yield_hold_s > 0:
            pending.yields_due = time.monotonic() + self.yield_hold_s
            self._holding[msg_id] = pending
        else:
            self._send_held_yields(msg_id, pending)

    @staticmethod
    def _elected_copy(msg: dict, msg_id: str, executor: int,
                      device_ids: list[int] | None, epoch: str) -> dict:
        """The client's request as one replica gets it: ``execute_request`` with the committed
        GPUs for the executor (``device_ids`` given), ``yield_request`` for the others.
        ``epoch`` names this front instance: a request that a restarted front sends again
        (its client resent it) must not look like a replay to the replicas' Session, which
        drops a repeated signature; they answer it from their record instead."""
        copy = {
            "header": {**msg["header"], "msg_id": msg_id},
            "parent_header": msg["parent_header"],
            "metadata": dict(msg.get("metadata") or {}),
            "content": msg.get("content_frame") or msg["content"],
            "buffers": msg.get("buffers", []),
        }
        notebookos_md = dict(copy["metadata"].get("notebookos") or {})
        notebookos_md["target_replica_id"] = executor
        notebookos_md["front_epoch"] = epoch
        copy["metadata"]["notebookos"] = notebookos_md
        if device_ids is not None:
            copy["metadata"]["gpu_device_ids"] = list(device_ids)
        else:
            copy["header"]["msg_type"] = "yield_request"
        return copy

    def _send_held_yields(self, msg_id: str, pending: _Pending) -> None:
        """Send the ``yield_request`` copies still held for this request (to the replicas still
        connected) and expect their replies."""
        self._holding.pop(msg_id, None)
        held, pending.held_yields = pending.held_yields, []
        assert pending.client_msg is not None and pending.source is not None
        for rid in held:
            if rid in self._replicas:
                pending.asked.add(rid)
                self.session.send(self._replica_socket(rid, "shell"),
                                  self._elected_copy(pending.client_msg, msg_id,
                                                     pending.source, None, self._epoch))

    def _send_due_yields(self) -> None:
        now = time.monotonic()
        for msg_id, pending in list(self._holding.items()):
            if self._pending.get(msg_id) is not pending:  # answered (or settled) meanwhile
                self._holding.pop(msg_id, None)
            elif now >= pending.yields_due:
                self._send_held_yields(msg_id, pending)

