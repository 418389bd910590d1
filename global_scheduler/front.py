"""A distributed kernel's front: the five ZMQ sockets Jupyter Server talks to, and the routing.

To Jupyter Server the front *is* the kernel. Every front of the process is served by one loop
(front_loop.py: asyncio over epoll, no polling), which owns all its sockets: the five bound front
sockets (shell, control, stdin: ROUTER; iopub: XPUB; hb: REP echo) and, per replica, DEALER
sockets to its shell/control/stdin and a SUB socket on its iopub. Other threads hand a front
work as commands, run on the loop in order with the messages it routes.

``KernelFront`` is the wiring and two handler tables, in the manner of ipykernel's kernelbase:

- ``SOCKET_HANDLERS``: socket name -> the handler of a message read from it, called with the
  channel, the replica id (None for a client socket) and the frames (the loop's one ordered
  dispatch, ``_dispatch``);
- ``CLIENT_HANDLERS``: (channel, msg_type) -> the handler of a verified client request once a
  replica can take it; anything not listed goes to one live replica (``_to_one_replica``).

A new kind of client request gets a handler method here and a row in ``CLIENT_HANDLERS``; a new
job gets a module of its own, mixed in below. The jobs, one module each:

- front_gate.py: the gate that holds requests while the replicas start (and while no client has
  subscribed to IOPub), and answers what it can while no replica is connected;
- front_execute.py: the execute router (placement, the executor and the standbys' yields,
  resubmission, withdrawal);
- front_replies.py: the reply merger (the replicas' replies -> the one the client sees);
- front_iopub.py: the IOPub merger (the replicas' IOPub -> the client's one stream);
- front_replicas.py: the connections to the replicas; front_pump.py: the front's turn on the
  loop; front_messages.py: signature checks; front_hooks.py: every hook the service gives the
  front (``FrontHooks``).

Other shell requests go to one live replica; ``interrupt_request``/``shutdown_request`` on
control go to every replica (first reply forwarded); other control requests to one replica.
stdin: ``input_request`` from the executor goes to the client; the ``input_reply`` goes back.
Messages with a bad signature (either side) are dropped and counted; nothing here raises out of
the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import ClassVar

import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front_execute import YIELD_HOLD_S, ExecuteRouter  # noqa: F401
from notebookos.global_scheduler.front_gate import START_FAILED, StartGate  # noqa: F401
from notebookos.global_scheduler.front_hooks import (  # noqa: F401 - re-exported
    FrontHooks,
    PlacementFailed,
    call_optional,
)
from notebookos.global_scheduler.front_iopub import GS_USERNAME, IOPubMerger  # noqa: F401
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.front_messages import MessageChecks
from notebookos.global_scheduler.front_pump import RETRY_S, SocketPump
from notebookos.global_scheduler.front_replicas import ReplicaEndpoint, ReplicaLinks  # noqa: F401
from notebookos.global_scheduler.front_replies import (  # noqa: F401 - re-exported
    ALL_YIELDED,
    REPLICAS_LOST,
    UNROUTED_KEEP_S,
    ReplyMerger,
)
from notebookos.global_scheduler.front_requests import MAX_RESUBMISSIONS, _Pending  # noqa: F401
from notebookos.global_scheduler.front_sockets import FrontSockets
from notebookos.global_scheduler.loop_waits import SignallingEvent
from notebookos.unrouted import UnroutedReplies
from notebookos.zmq_frames import send_frames

log = logging.getLogger(__name__)


# A client request once verified: (channel, idents, msg, its signed frames)
ClientHandler = Callable[[str, list[bytes], dict, list[bytes]], None]
# A message as read from a socket: (channel, replica id or None for a client socket, frames)
SocketHandler = Callable[[str, int | None, list[bytes]], None]


class KernelFront(StartGate, ExecuteRouter, ReplyMerger, IOPubMerger, ReplicaLinks, SocketPump,
                  MessageChecks):
    # socket -> the method that handles a message read from it
    SOCKET_HANDLERS: ClassVar[dict[str, str]] = {
        "hb": "_echo_heartbeat",
        "iopub": "_client_subscription",  # XPUB: (un)subscriptions of clients
        "shell": "_from_client_shell",
        "control": "_from_client",
        "stdin": "_from_client",
        "replica-shell": "_from_replica",
        "replica-control": "_from_replica",
        "replica-stdin": "_input_request",
        "replica-iopub": "_replica_iopub",
    }
    # (channel, msg_type) of a client request -> its handler; anything else: _to_one_replica
    CLIENT_HANDLERS: ClassVar[dict[tuple[str, str], str]] = {
        ("shell", "execute_request"): "_execute_request",
        ("shell", "interrupt_request"): "_interrupt_request",
        ("control", "interrupt_request"): "_interrupt_request",
        ("control", "shutdown_request"): "_shutdown_request",
    }

    def __init__(
        self,
        kernel_id: str,
        key: str,
        signature_scheme: str,
        hooks: FrontHooks,
        *,
        ip: str = "127.0.0.1",
        ports: dict[str, int] | None = None,
        starting: bool = False,
        kernel_info: dict | None = None,
        bound: FrontSockets | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.hooks = hooks
        self.ip = ip
        self.session = Session(key=key.encode(), signature_scheme=signature_scheme,
                               username=GS_USERNAME)
        self.context = zmq.Context.instance()
        # The same identity across Global Scheduler restarts: a replica's reply to a request
        # routed by the previous instance is routed by its ROUTER to this one.
        self.identity = f"notebookos-gs-{kernel_id}".encode()
        self.ports: dict[str, int] = {}
        self._sockets: dict[str, zmq.Socket] = {}
        self._input_source: OrderedDict[str, int] = OrderedDict()  # input_request -> replica
        self._stop = threading.Event()
        # Set by a client's first frame on any client socket (an IOPub subscription, a request,
        # a heartbeat) or by close(): a kernel's replicas may wait for it to start (lifecycle).
        self.client_attached = SignallingEvent()  # awaited on the loop (lifecycle)
        self._bound_at = time.monotonic()
        self._init_checks()
        self._init_pump()
        self._init_replicas()
        self._init_replies()
        self._init_iopub(rebound=bool(ports))
        self._init_execute()
        self._init_gate(starting, kernel_info)
        # bound once (a subclass's override included): socket -> (handler, channel)
        self._socket_handlers: dict[str, tuple[SocketHandler, str]] = {
            name: (getattr(self, method), name.removeprefix("replica-"))
            for name, method in self.SOCKET_HANDLERS.items()}
        self._client_handlers: dict[tuple[str, str], ClientHandler] = {
            key: getattr(self, method) for key, method in self.CLIENT_HANDLERS.items()}
        self._bind(ports or {}, bound)

    # -- setup ------------------------------------------------------------------------------

    def _bind(self, ports: dict[str, int], bound: FrontSockets | None) -> None:
        """The five client-facing sockets: ``bound`` (a spare set bound ahead, when given and no
        ``ports`` are asked for), else bound here (``front_sockets.FrontSockets``)."""
        if bound is None or ports:
            if bound is not None:
                bound.close()
            bound = FrontSockets(self.ip, ports)
        self._sockets, self.ports = bound.sockets, bound.ports
        # a reply for a client that has not (re)connected yet is kept, not dropped
        # (retried at most every poll interval, not on every message the loop handles)
        self._unrouted = UnroutedReplies(self._sockets["shell"], keep_s=UNROUTED_KEEP_S,
                                         retry_every_s=RETRY_S)

    def start(self) -> None:
        """Serve this front on the process's front loop from now on."""
        self._loop = FrontLoop.shared()
        self._loop.call(self._service)

    def close(self) -> None:
        """Stop routing and close every socket (on the loop, waited for up to 5 s)."""
        self._stop.set()
        self.client_attached.set()  # a start waiting for a client goes on (and finds it gone)
        if self._loop is None or not self._loop.alive():
            self._close_sockets()
            return
        try:
            self._loop.run(self._close_sockets, timeout=5)
        except TimeoutError:  # the loop is held up: it closes them when it gets there
            log.warning("kernel %s: the front loop did not close the front within 5 s",
                        self.kernel_id)

    def _close_sockets(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cancel_tick()
        for sock in list(self._watched):
            self._unwatch(sock)
        for sock in self._sockets.values():
            sock.close(linger=0)
        for r in self._replicas.values():
            r.close()
        self._replicas.clear()

    # -- the handler tables -----------------------------------------------------------------

    def _dispatch(self, name: str, rid: int | None, frames: list[bytes]) -> None:
        """A message read from the socket ``name`` (of replica ``rid``): to its handler."""
        if not self.client_attached.is_set() and not name.startswith("replica"):
            self.client_attached.set()
        handler, channel = self._socket_handlers[name]
        handler(channel, rid, frames)

    def _echo_heartbeat(self, channel: str, rid: int | None, frames: list[bytes]) -> None:
        send_frames(self._sockets["hb"], frames)

    def _client_subscription(self, channel: str, rid: int | None, frames: list[bytes]) -> None:
        self._iopub_subscription(frames)

    def _replica_iopub(self, channel: str, rid: int | None, frames: list[bytes]) -> None:
        assert rid is not None
        self._from_replica_iopub(rid, frames)

    def _from_client_shell(self, channel: str, rid: int | None, frames: list[bytes]) -> None:
        if self._must_defer():  # no client has subscribed to IOPub yet (front_gate.py)
            self._deferred.append(("shell", frames))
        else:
            self._from_client("shell", rid, frames)

    def _from_client(self, channel: str, rid: int | None, frames: list[bytes]) -> None:
        """A client's message on shell, control or stdin: verified, then held by the gate
        while the replicas start, else routed."""
        if channel in ("shell", "control"):
            log.debug("kernel %s: %s message from a client (%d frames)", self.kernel_id,
                      channel, len(frames))
        self._apply_commands()  # replica changes queued before this message came in
        idents, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify(msg_list)
        if msg is None:
            return
        if channel == "stdin":
            self._input_reply(msg, msg_list)
        elif self._starting:
            self._while_starting(channel, idents, msg, msg_list)
        else:
            self._route_client(channel, idents, msg, msg_list)

    def _route_client(self, channel: str, idents: list[bytes], msg: dict,
                      msg_list: list[bytes]) -> None:
        """A verified client request on shell or control: to its handler, or the gate's
        answer while no replica is connected."""
        if not self._replicas:
            self._without_replicas(channel, idents, msg)
            return
        msg_type = msg["header"].get("msg_type", "")
        handler = self._client_handlers.get((channel, msg_type), self._to_one_replica)
        handler(channel, idents, msg, msg_list)

    # -- client request handlers ------------------------------------------------------------

    def _execute_request(self, channel: str, idents: list[bytes], msg: dict,
                         msg_list: list[bytes]) -> None:
        msg["content_frame"] = msg_list[4]  # re-sent as is to every replica
        self._route_execute(idents, msg, self._election_id(msg), attempt=0)

    def _interrupt_request(self, channel: str, idents: list[bytes], msg: dict,
                           msg_list: list[bytes]) -> None:
        """Cells still waiting never run; the replicas interrupt the running one (every
        replica on control, one on shell)."""
        self._withdraw_waiting("the kernel was interrupted")
        if channel == "control":
            self._to_every_replica(channel, idents, msg, msg_list)
        else:
            self._to_one_replica(channel, idents, msg, msg_list)

    def _shutdown_request(self, channel: str, idents: list[bytes], msg: dict,
                          msg_list: list[bytes]) -> None:
        # the replicas' exits that follow are not failures
        call_optional(self.hooks, "shutdown_requested", self.kernel_id)
        self._to_every_replica(channel, idents, msg, msg_list)

    def _to_one_replica(self, channel: str, idents: list[bytes], msg: dict,
                        msg_list: list[bytes]) -> None:
        """The preferred replica (the last cell's executor) answers, and publishes the
        request's IOPub."""
        live = sorted(self._replicas)
        pick = self.preferred_replica if self.preferred_replica in self._replicas else live[0]
        msg_id = msg["header"].get("msg_id", "")
        self._remember(self._iopub_source, msg_id, pick)
        self._ask(channel, idents, msg, msg_list, [pick], source=pick)

    def _to_every_replica(self, channel: str, idents: list[bytes], msg: dict,
                          msg_list: list[bytes]) -> None:
        """Every replica; the first to answer is the one the client hears."""
        self._ask(channel, idents, msg, msg_list, sorted(self._replicas), source=None)

    def _ask(self, channel: str, idents: list[bytes], msg: dict, msg_list: list[bytes],
             targets: list[int], source: int | None) -> None:
        msg_id = msg["header"].get("msg_id", "")
        msg_type = msg["header"].get("msg_type", "")
        self._pending[msg_id] = _Pending(channel, idents, msg_type, source, asked=set(targets),
                                         client_msg=msg, frames=list(msg_list))
        for rid in targets:
            send_frames(self._replica_socket(rid, channel), [b"<IDS|MSG>", *msg_list])

    # -- stdin ------------------------------------------------------------------------------

    def _input_request(self, channel: str, rid: int | None, frames: list[bytes]) -> None:
        """A replica asks the client for input: forwarded when it runs the request."""
        _, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify(msg_list, content=False)
        if msg is None:
            return
        pending = self._pending.get(msg["parent_header"].get("msg_id", ""))
        if pending is not None and rid is not None and rid == pending.source:
            self._remember(self._input_source, msg["header"]["msg_id"], rid)
            send_frames(self._sockets["stdin"], [*pending.idents, b"<IDS|MSG>", *msg_list])

    def _input_reply(self, msg: dict, msg_list: list[bytes]) -> None:
        """The client's answer: to the replica that asked. jupyter_client's ``input()`` (the
        console, ``execute_interactive``) sends it without a parent header, so an answer naming
        no request goes to the replica that asked last (one cell asks at a time)."""
        parent_id = msg["parent_header"].get("msg_id", "")
        rid = self._input_source.get(parent_id)
        if rid is None and not parent_id and self._input_source:
            rid = next(reversed(self._input_source.values()))
        if rid is not None and rid in self._replicas:
            send_frames(self._replica_socket(rid, "stdin"), [b"<IDS|MSG>", *msg_list])
