"""The gate that holds a front's requests while they cannot reach a replica.

- A front bound while its kernel's replicas start (``starting``) answers kernel_info itself (so
  the client sees a live kernel at once) and holds every other request, in order, until
  ``replicas_ready`` (sent to the replicas then) or ``start_failed`` (answered with the reason).
- While no replica is connected (all being replaced), an execute request still goes to the
  execute router (its placement waits for the replicas), kernel_info and interrupts are
  answered here, anything else gets an error reply that says why.
- Shell requests wait (briefly) until a client has subscribed to IOPub: after a restart the
  front's XPUB is new, and what it publishes before the client's SUB reconnects is lost (ZMQ's
  slow joiner), so the client would wait forever for the cell's idle.

Mixed into ``KernelFront``.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from notebookos.global_scheduler.front_hooks import call_optional
from notebookos.global_scheduler.kernel_info import starting_kernel_info

log = logging.getLogger(__name__)

START_FAILED = "NotebookOSStartFailed"  # the replicas of a kernel that was bound never came


class StartGate:
    def _init_gate(self, starting: bool, kernel_info: dict | None) -> None:
        # A kernel bound before its replicas are ready (``starting``): kernel_info is answered
        # here (``kernel_info``: a replica's reply content, else one made up), every other
        # request is held, in order, until ``replicas_ready`` or ``start_failed``.
        self.kernel_info = kernel_info
        self._starting = starting
        self._start_failure: str | None = None
        self._held_requests: deque[tuple[str, list[bytes], dict, list[bytes]]] = deque()
        # shell messages held until a client subscribed to IOPub (or the wait is over)
        self._deferred: list[tuple[str, list[bytes]]] = []
        self._subscription_wait_s = 3.0

    def replicas_ready(self) -> None:
        """The replicas of a kernel bound while ``starting`` are connected (``set_replicas``):
        send them the requests held meanwhile, in the order they came."""
        def apply() -> None:
            self._starting = False
            if self._stop.is_set():
                return
            held, self._held_requests = self._held_requests, deque()
            for channel, idents, msg, msg_list in held:
                self._route_safely(channel, idents, msg, msg_list)

        self._run_on_loop(apply)

    def start_failed(self, reason: str) -> None:
        """The replicas of a kernel bound while ``starting`` never came: every held request
        (and any later one) gets an error reply that says why."""
        def apply() -> None:
            self._starting = False
            self._start_failure = reason
            if self._stop.is_set():
                return
            held, self._held_requests = self._held_requests, deque()
            for channel, idents, msg, _ in held:
                self._without_replicas(channel, idents, msg)

        self._run_on_loop(apply)

    def _while_starting(self, channel: str, idents: list[bytes], msg: dict,
                        msg_list: list[bytes]) -> None:
        """The replicas are not ready yet: kernel_info is answered here (so the client sees a
        live kernel at once), everything else waits for them."""
        msg_type = msg["header"].get("msg_type")
        if self._answered_without_replicas(channel, idents, msg, {"starting": True}):
            return
        if msg_type == "execute_request":  # its interactivity delay counts from now
            self._remember(self._arrivals, msg["header"].get("msg_id", ""), time.monotonic())
            self._note_wait(msg, "replicas starting", "the kernel's replicas were starting")
        self._held_requests.append((channel, idents, msg, msg_list))

    def _answered_without_replicas(self, channel: str, idents: list[bytes], msg: dict,
                                   notebookos_md: dict) -> bool:
        """While no replica can answer (starting, or all being replaced): kernel_info from the
        reply kept (the kernel is alive), and an interrupt withdraws the cells waiting (nothing
        runs). True when ``msg`` was one of those and is answered."""
        msg_type = msg["header"].get("msg_type")
        if msg_type == "kernel_info_request":
            self._answer_here(channel, idents, msg, "kernel_info_reply",
                              dict(self.kernel_info or starting_kernel_info()),
                              {"notebookos": notebookos_md})
            return True
        if msg_type == "interrupt_request":
            self._withdraw_waiting("the kernel was interrupted")
            self._answer_here(channel, idents, msg, "interrupt_reply", {"status": "ok"})
            return True
        if msg_type == "shutdown_request" and not self._starting:
            # Jupyter's shutdown or restart of a kernel without replicas (hibernated, or all
            # being replaced): it stops now, as the replicas would have; a restart follows as
            # RestartKernel. An error reply here left it "alive" to Jupyter's shutdown, which
            # waited its shutdown_wait_time for nothing.
            call_optional(self.hooks, "shutdown_requested", self.kernel_id)
            restart = bool((msg.get("content") or {}).get("restart", False))
            self._answer_here(channel, idents, msg, "shutdown_reply",
                              {"status": "ok", "restart": restart})
            return True
        return False

    def _answer_here(self, channel: str, idents: list[bytes], parent: dict, reply_type: str,
                     content: dict, metadata: dict | None = None) -> None:
        """Reply to the client without a replica: busy, the reply, idle."""
        msg = self.session.msg
        self._send_iopub(msg("status", {"execution_state": "busy"}, parent=parent),
                         b"kernel.notebookos.status")
        self._reply(channel, self.session.serialize(
            msg(reply_type, content, parent=parent, metadata=metadata or {}), ident=idents))
        self._send_iopub(msg("status", {"execution_state": "idle"}, parent=parent),
                         b"kernel.notebookos.status")

    def _without_replicas(self, channel: str, idents: list[bytes], msg: dict) -> None:
        """A client request while the kernel has no replica connected."""
        if self._start_failure is not None:
            self._reply_error(channel, idents, msg, START_FAILED,
                              f"the kernel's replicas could not be started: "
                              f"{self._start_failure}")
            return
        msg_type = msg["header"].get("msg_type", "")
        if channel == "shell" and msg_type == "execute_request":
            # Its replicas are being replaced (every one was lost, a rebuild from the
            # checkpoint, a restart of the Global Scheduler): the placement waits for them and
            # tells the cell why, so the cell is not lost.
            self._route_execute(idents, msg, self._election_id(msg), attempt=0)
            return
        if self._answered_without_replicas(channel, idents, msg, {"replicas": 0}):
            return
        self._reply_error(channel, idents, msg, "NoReplicas",
                          f"the kernel has no live replica right now (its replicas are being "
                          f"replaced), so {msg_type or 'the request'} cannot be answered; "
                          "retry shortly")

    def _route_safely(self, channel: str, idents: list[bytes], msg: dict,
                      msg_list: list[bytes]) -> None:
        try:
            self._route_client(channel, idents, msg, msg_list)
        except Exception:  # noqa: BLE001 - one bad message must not stop the others
            self._dropped("malformed")
            log.exception("kernel %s: dropping a held message on %s", self.kernel_id, channel)

    def _must_defer(self) -> bool:
        if self._iopub_subscribed:
            return False
        return time.monotonic() - self._bound_at < self._subscription_wait_s

    def _release_deferred(self) -> None:
        if not self._deferred or self._must_defer():
            return
        deferred, self._deferred = self._deferred, []
        for name, frames in deferred:
            try:
                self._from_client(name, None, frames)
            except Exception:  # noqa: BLE001 - one bad message must not stop the kernel
                self._dropped("malformed")
                log.exception("kernel %s: dropping a deferred message on %s", self.kernel_id,
                              name)

