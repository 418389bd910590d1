"""The front of a kernel under a per-cell container policy (``batch``, ``lcp``).

Such a kernel is *parked* between cells: no replica runs, its state is the store checkpoint. The
front differs from ``KernelFront`` in three ways:

- ``execute_request`` is placed off the front's thread (starting the cell's container takes
  seconds, and a batch cell may wait in the cluster's FCFS queue), one cell of the kernel at a
  time: later requests wait in the front's backlog, in order, so the client's queued cells run
  one after another and the front keeps answering everything else meanwhile;
- before it sends the cell to a fresh container it waits for the container's IOPub welcome
  (ipykernel's XPUB answers a subscription with ``iopub_welcome``), so no output is lost to
  ZMQ's slow joiner; the cell is set aside meanwhile (the loop serves every front: it never
  blocks on one), and sent when the welcome comes or ``WELCOME_WAIT_S`` has passed;
- requests that arrive while parked get an answer without a replica: ``kernel_info`` from the
  reply cached at start, ``is_complete`` ``unknown``, ``comm_info`` no comms, ``interrupt`` and
  ``shutdown`` a plain ok (there is nothing to interrupt or stop); ``complete``, ``inspect``,
  ``history`` an error reply that says why (no namespace is loaded between cells).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from notebookos.global_scheduler.front import KernelFront, PlacementFailed

log = logging.getLogger(__name__)

PARKED = "NotebookOSKernelParked"
WELCOME_WAIT_S = 3.0


class CellFront(KernelFront):
    # A cell whose container was lost mid-run is resubmitted, and its placement refuses it with
    # the container's reason (cell_containers.py, lost_cells): at most once there too.
    fail_lost_started_cells = False

    def __init__(self, *args: Any, kernel_info: dict | None = None,
                 on_interrupt_parked: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kernel_info = kernel_info  # the content of a replica's kernel_info_reply
        self.on_interrupt_parked = on_interrupt_parked
        self._cell: str | None = None  # client msg_id of the cell being placed or run
        self._backlog: deque[tuple[list[bytes], dict, str]] = deque()
        self._welcomed: set[int] = set()
        # cells set aside until their container's IOPub welcome: replica -> (deadline, send)
        self._welcome_waiters: dict[int, tuple[float, Callable[[], None]]] = {}
        self.rest_standby_links = False  # a container's links come and go with its cell

    # -- while parked -------------------------------------------------------------------------

    def _without_replicas(self, channel: str, idents: list[bytes], msg: dict) -> None:
        msg_type = msg["header"].get("msg_type", "")
        if channel == "shell" and msg_type == "execute_request":
            self._route_execute(idents, msg, msg["header"]["msg_id"], attempt=0)
            return
        if msg_type == "interrupt_request" and self.on_interrupt_parked is not None:
            self.on_interrupt_parked()  # a cell waiting for a host stops waiting
        content = self._parked_answer(msg_type, msg.get("content") or {})
        if content is None:
            self._reply_error(channel, idents, msg, PARKED,
                              "the kernel is parked: under this scheduling policy no container "
                              "runs between cells (the namespace is in the store checkpoint), "
                              f"so {msg_type} cannot be answered until a cell runs")
            return
        iopub = self._sockets["iopub"]
        reply_type = msg_type.replace("_request", "_reply")
        self.session.send(iopub, "status", {"execution_state": "busy"}, parent=msg,
                          ident=b"kernel.notebookos.status")
        self.session.send(self._sockets[channel], reply_type, content, parent=msg, ident=idents,
                          metadata={"notebookos": {"parked": True}})
        self.session.send(iopub, "status", {"execution_state": "idle"}, parent=msg,
                          ident=b"kernel.notebookos.status")

    def _parked_answer(self, msg_type: str, content: dict) -> dict | None:
        if msg_type == "kernel_info_request":
            return dict(self.kernel_info) if self.kernel_info else None
        if msg_type == "is_complete_request":
            return {"status": "unknown"}
        if msg_type == "comm_info_request":
            return {"status": "ok", "comms": {}}
        if msg_type == "interrupt_request":
            return {"status": "ok"}
        if msg_type == "shutdown_request":
            return {"status": "ok", "restart": bool(content.get("restart", False))}
        return None

    def _from_replica(self, channel: str, rid: int, frames: list[bytes]) -> None:
        super()._from_replica(channel, rid, frames)
        if channel == "shell" and self.kernel_info is None:
            self._learn_kernel_info(frames)

    def _learn_kernel_info(self, frames: list[bytes]) -> None:
        _, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify_quiet(msg_list)
        if msg is not None and msg["header"].get("msg_type") == "kernel_info_reply":
            self.kernel_info = msg["content"]

    # -- one cell at a time, placed off the front's thread -------------------------------------

    def _route_execute(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int) -> None:
        if attempt == 0:
            if self._cell is not None:
                self._backlog.append((idents, msg, msg_id))
                return
            self._cell = msg_id
        metadata = dict(msg.get("metadata") or {})

        self._place(msg_id, metadata,
                    lambda result: self._placed(idents, msg, msg_id, attempt, result))

    def _placed(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int,
                result: Any) -> None:
        if self._stop.is_set():
            return
        if isinstance(result, PlacementFailed):
            self._reply_error("shell", idents, msg, "NotebookOSNoGPUs", str(result))
            return
        executor, device_ids = result
        self._send_execute(idents, msg, msg_id, attempt, executor, device_ids)

    def _send_execute(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int,
                      executor: int, device_ids: list[int]) -> None:
        self._apply_commands()  # the cell's container was just connected
        replica = self._replicas.get(executor)
        if replica is not None and executor not in self._welcomed:
            def send() -> None:
                self._send_execute(idents, msg, msg_id, attempt, executor, device_ids)

            if self._started:  # set aside until the welcome (or WELCOME_WAIT_S)
                self._welcome_waiters[executor] = (time.monotonic() + WELCOME_WAIT_S, send)
                return
            self._await_welcome(executor, self._replica_socket(executor, "iopub"))
            self._apply_commands()
        if executor not in self._replicas:
            self.hooks.release_execute(self.kernel_id, msg_id)
            self._reply_error("shell", idents, msg, "NotebookOSContainerLost",
                              f"the container started for this cell (replica {executor}) was "
                              "lost before the cell was sent to it; the cell did not run")
            return
        super()._send_execute(idents, msg, msg_id, attempt, executor, device_ids)

    def _from_replica_iopub(self, rid: int, frames: list[bytes]) -> None:
        if rid not in self._welcomed and self._is_welcome(frames):
            # The loop read the container's IOPub before its cell was sent: note the welcome
            # here, or the cell would wait for one that has already come.
            self._welcomed.add(rid)
            waiter = self._welcome_waiters.pop(rid, None)
            if waiter is not None:
                waiter[1]()
            return
        super()._from_replica_iopub(rid, frames)

    def _is_welcome(self, frames: list[bytes]) -> bool:
        _, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify_quiet(msg_list)
        return msg is not None and msg["header"].get("msg_type") == "iopub_welcome"

    def _next_duty(self) -> float | None:
        due = super()._next_duty()
        for deadline, _ in self._welcome_waiters.values():
            due = deadline if due is None else min(due, deadline)
        return due

    def _timed_duties(self) -> None:
        super()._timed_duties()
        now = time.monotonic()
        for rid, (deadline, send) in list(self._welcome_waiters.items()):
            if rid not in self._replicas or now >= deadline:
                del self._welcome_waiters[rid]
                if rid in self._replicas:
                    log.warning("kernel %s: replica %d sent no IOPub welcome within %gs",
                                self.kernel_id, rid, WELCOME_WAIT_S)
                    self._welcomed.add(rid)
                send()  # sent now, or answered that its container was lost

    def _await_welcome(self, rid: int, sock: zmq.Socket) -> None:
        """Wait until the container's IOPub has our subscription (its welcome message); only
        for a front not served by the loop."""
        deadline = time.monotonic() + WELCOME_WAIT_S
        while time.monotonic() < deadline:
            if not sock.poll(int(max(1, (deadline - time.monotonic()) * 1000))):
                break
            self._dispatch("replica-iopub", rid, sock.recv_multipart())
            if rid in self._welcomed:
                return
        log.warning("kernel %s: replica %d sent no IOPub welcome within %gs", self.kernel_id, rid,
                    WELCOME_WAIT_S)

    def _to_client(self, pending: Any, msg: dict, msg_list: list[bytes]) -> None:
        super()._to_client(pending, msg, msg_list)
        if pending.msg_type == "execute_request":
            self._cell_done()

    def _reply_error(self, channel: str, idents: list[bytes], parent: dict, ename: str,
                     evalue: str) -> None:
        super()._reply_error(channel, idents, parent, ename, evalue)
        if parent["header"].get("msg_type") == "execute_request":
            self._cell_done()

    def _cell_done(self) -> None:
        self._cell = None
        if self._backlog:
            idents, msg, msg_id = self._backlog.popleft()
            self._route_execute(idents, msg, msg_id, attempt=0)
