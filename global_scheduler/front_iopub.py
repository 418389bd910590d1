"""The IOPub merger: a front's one IOPub stream, made from its replicas' three.

Only the IOPub of the replica that is the source of a request reaches the client (the executor
for a cell: one busy, its output, one idle); the rest is dropped. The hot path of every cell: it
reads only the header and parent header, checks the signature of what it forwards, and leaves
content alone. An executor's ``idle`` that comes before its ``execute_reply`` is held until the
reply went to the client, and the busy/idle of an attempt whose election failed never reach it.

IOPub while no client subscribes (after a (re)bind, until the client's SUB reconnects) is held
in a bounded backlog and published on the client's subscription. The replicas hold theirs while
the front is away (kernel/iopub.py), so a cell running across a Global Scheduler restart loses
no output: for a request this instance did not route, the first replica publishing for it is
taken as its executor (standbys publish nothing for a ``yield_request``).

Mixed into ``KernelFront``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from notebookos.backlog import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES, Backlog
from notebookos.global_scheduler.front_requests import _Pending
from notebookos.zmq_frames import send_frames

log = logging.getLogger(__name__)

# The username of the requests the Global Scheduler itself sends replicas (readiness.py,
# control.py); the front forwards clients' requests with their own headers.
GS_USERNAME = "notebookos-gs"
# how long a re-bound front's IOPub waits after the last client (re)subscription
RESUBSCRIBE_QUIET_S = 0.3


class IOPubMerger:
    def _init_iopub(self, rebound: bool) -> None:
        self._iopub_source: OrderedDict[str, int] = OrderedDict()  # msg_id -> replica
        # requests whose source was learnt from the replicas (one published output for it, or
        # answered as its executor), not assigned by this front's routing: never reassigned
        self._source_seen: OrderedDict[str, bool] = OrderedDict()
        # Cells answered whose executor has not published idle yet (it is replicating what the
        # cell changed): election id -> (executor, the client's request)
        self._awaiting_idle: OrderedDict[str, tuple[int, dict]] = OrderedDict()
        # Attempts whose election failed and that run again under a new id: their replicas'
        # busy/idle are not the cell's (election id -> attempt)
        self._superseded: OrderedDict[str, int] = OrderedDict()
        self._iopub_subscribed = False  # a client has subscribed since the front was bound
        # IOPub for clients: held while no client subscribes (see the module doc).
        self._iopub_topics: set[bytes] = set()
        self.iopub_held = Backlog(DEFAULT_MAX_MESSAGES, DEFAULT_MAX_BYTES)
        # A front re-bound on its old ports (a Global Scheduler restart) has several client
        # SUBs reconnecting at once (Jupyter Server's websocket and its activity watcher); XPUB
        # reports only the first, and what is published before a later one has subscribed is
        # lost to it. So, re-bound, IOPub waits until no subscription came for a short while.
        self._rebound = rebound
        self._last_subscription = 0.0

    def _iopub_subscription(self, frames: list[bytes]) -> None:
        """XPUB reports a topic's first subscriber (``\\x01topic``) and its last one leaving
        (``\\x00topic``, also when the client's connection dies)."""
        for frame in frames:
            if frame[:1] == b"\x01":
                self._iopub_topics.add(bytes(frame[1:]))
                self._iopub_subscribed = True
                self._last_subscription = time.monotonic()
            elif frame[:1] == b"\x00":
                self._iopub_topics.discard(bytes(frame[1:]))
        if self._iopub_topics:
            self._flush_iopub()
            self._release_deferred()

    def _iopub_settling(self) -> bool:
        """Re-bound and within the first seconds: clients may still be re-subscribing."""
        if not self._rebound:
            return False
        now = time.monotonic()
        if now - self._bound_at > self._subscription_wait_s + RESUBSCRIBE_QUIET_S:
            self._rebound = False  # settled for good: the hot path skips this from now on
            return False
        return now - self._last_subscription < RESUBSCRIBE_QUIET_S

    def _publish(self, frames: list[bytes]) -> None:
        """Send on the client IOPub, or hold while no client subscribes."""
        if self._iopub_topics and not self.iopub_held and not self._iopub_settling():
            send_frames(self._sockets["iopub"], frames)
            return
        dropped = self.iopub_held.append(frames)
        if dropped:
            log.warning("kernel %s: no IOPub subscriber; dropped %d oldest held message(s) "
                        "(%d so far)", self.kernel_id, dropped, self.iopub_held.dropped)
        self._flush_iopub()

    def _flush_iopub(self) -> None:
        if self._iopub_settling():
            return  # the loop flushes once the subscriptions have settled
        while self.iopub_held and self._iopub_topics:
            send_frames(self._sockets["iopub"], self.iopub_held.popleft()[0])

    def _send_status(self, state: str, parent: dict) -> None:
        """A status message of the front's own (``busy``/``idle``) for the client's ``parent``."""
        self._send_iopub(self.session.msg("status", {"execution_state": state}, parent=parent),
                         b"kernel.notebookos.status")

    def _send_note(self, text: str, parent: dict) -> None:
        """A ``NotebookOS: ...`` line on stderr, in the output of the client's ``parent``."""
        self._send_iopub(self.session.msg("stream", {"name": "stderr",
                                                     "text": f"NotebookOS: {text}\n"},
                                          parent=parent), b"kernel.notebookos.stream")

    def _send_iopub(self, msg: dict, ident: bytes | list[bytes]) -> None:
        """Sign ``msg`` (a Session message dict, buffers included) and publish it."""
        frames = self.session.serialize(msg, ident=ident)
        self._publish([*frames, *msg.get("buffers", [])])

    def _from_replica_iopub(self, rid: int, frames: list[bytes]) -> None:
        """Forward the IOPub of the replica that is the source of its request; drop the rest.

        The hot path of every cell: it reads only the header and parent header, checks the
        signature of what it forwards (dropping needs no trust), and leaves content alone.
        """
        idents, msg_list = self.session.feed_identities(frames, copy=True)
        if len(msg_list) < 5:
            raise ValueError(f"IOPub message with {len(msg_list)} frames")
        parent = self._unpack(msg_list[2])
        parent_id = str(parent.get("msg_id", ""))
        source = self._iopub_source.get(parent_id)
        header: dict | None = None
        if source is None:
            pending = self._pending.get(parent_id)
            source = pending.source if pending is not None else None
            if pending is not None and source is None:  # broadcast: the first replica speaks
                source = rid
                self._learn_source(parent_id, rid)
            elif pending is None and parent.get("username") == GS_USERNAME:
                # The Global Scheduler's own request (the readiness check's kernel_info, a
                # membership change): its busy and idle, held by the replica until this front
                # subscribed, are for no client.
                return
            elif pending is None and parent_id:
                # A request routed before a restart (replayed from the replicas' IOPub backlogs,
                # or still running): standbys publish nothing for a yield_request, so the
                # first replica publishing for it is its executor (or, for a broadcast control
                # request, the one that speaks, as above).
                source = rid
                self._learn_source(parent_id, rid)
        if source != rid and not self._executor_revealed(parent_id, rid, msg_list):
            return
        if not self._signature_ok(msg_list):
            return
        header = header or self._unpack(msg_list[1])
        msg_type = header.get("msg_type")
        log.debug("kernel %s: iopub %s from replica %d (parent %s)", self.kernel_id, msg_type,
                  rid, parent_id[-12:])
        if msg_type == "execute_input":
            pending = self._pending.get(parent_id)
            if pending is not None and not pending.started:
                pending.started = time.monotonic()
            self.hooks.execute_started(self.kernel_id, rid, parent_id)
        elif msg_type == "status" and self._status_withheld(parent_id, idents, msg_list):
            return
        self._forward_iopub(parent_id, idents, msg_list)

    def _learn_source(self, parent_id: str, rid: int) -> None:
        self._remember(self._iopub_source, parent_id, rid)
        self._remember(self._source_seen, parent_id, True)

    def _executor_revealed(self, parent_id: str, rid: int, msg_list: list[bytes]) -> bool:
        """Whether ``rid``, which this front did not send the cell ``parent_id`` to as its
        executor, shows that it is: it publishes the cell's output (anything but a status;
        standbys publish nothing, and a replica sent a cell that another one runs only waits
        for its end). After a Global Scheduler restart, a client resends the cell that is
        running, and this front may place the copy on another replica than the one running
        it: that one's output would otherwise be dropped, and the cell reply without it."""
        pending = self._pending.get(parent_id)
        if (pending is None or pending.msg_type != "execute_request"
                or parent_id in self._source_seen or not self._signature_ok(msg_list)):
            return False
        if self._unpack(msg_list[1]).get("msg_type") == "status":
            return False
        log.info("kernel %s: replica %d publishes the output of %s, which was sent to replica "
                 "%s: it runs the cell", self.kernel_id, rid, parent_id[:8], pending.source)
        self._executor_found(parent_id, pending, rid)
        return True

    def _executor_found(self, parent_id: str, pending: _Pending, rid: int) -> None:
        """``rid`` runs the cell that was sent to ``pending.source`` (which only waits for its
        end): its IOPub, input requests and idle are the cell's from now on. An idle held from
        the replica the cell was sent to is dropped: forwarded after the reply, it would end
        the cell for the client before the executor's output (its reply on shell can overtake
        its output on IOPub)."""
        self._learn_source(parent_id, rid)
        pending.source = rid
        pending.held_idle = None

    def _status_withheld(self, parent_id: str, idents: list[bytes], msg_list: list[bytes]
                         ) -> bool:
        """Whether a status message is kept from the client: the busy/idle of an attempt whose
        election failed (dropped), or an executor's ``idle`` that comes before its
        ``execute_reply`` (held until the reply has gone to the client). The election may fail
        (the replica chosen to run the cell could not propose in time: it was still applying
        the previous cell's state), and the cell then runs again under a new id: forwarded
        now, this idle would tell the client that the cell is done before it ran. A client takes reply + idle as the end of a cell
        (JupyterLab then drops the output that follows), and idle is the promise that the
        cell's state survives the loss of a replica: the fault campaign saw the output lost
        and, when the executor was killed right after its reply, the cell's state as well."""
        if parent_id in self._superseded:
            return True  # a failed attempt's busy or idle: the cell runs again
        if self._unpack(msg_list[4]).get("execution_state") != "idle":
            return False
        pending = self._pending.get(parent_id)
        if pending is None or pending.msg_type != "execute_request":
            self._awaiting_idle.pop(parent_id, None)  # the cell's state is replicated
            return False
        pending.held_idle = (parent_id, idents, msg_list)
        return True

    def _idle_after_reply(self, pending: _Pending, election_id: str) -> None:
        """After an execute_reply went to the client: the executor's idle if it was held, or
        one from the front when the executor is gone (no idle will ever come from it)."""
        if pending.held_idle is not None:
            held, pending.held_idle = pending.held_idle, None
            self._forward_iopub(*held)
        elif pending.source is None or pending.client_msg is None:
            return
        elif pending.source not in self._replicas:
            self._send_status("idle", pending.client_msg)
        else:
            self._remember(self._awaiting_idle, election_id, (pending.source, pending.client_msg),
                           limit=256)

    def _executors_lost_before_idle(self, dropped: set[int], warn: bool = True) -> None:
        """Executors lost after their reply and before their idle: they died while replicating
        what their cell changed. The client gets a warning (``warn``: not for a container
        parked once its checkpoint was durable) and the idle that will never come from them
        (JupyterLab would show the kernel busy for good)."""
        for msg_id, (rid, client_msg) in list(self._awaiting_idle.items()):
            if rid not in dropped:
                continue
            del self._awaiting_idle[msg_id]
            if warn:
                self._send_note(f"the replica that ran this cell (replica {rid}) was lost "
                                "before what the cell changed was replicated: its output "
                                "stands, but its changes to the namespace may be lost (the "
                                "next cell runs on the state the other replicas hold).",
                                client_msg)
            self._send_status("idle", client_msg)

    def _forward_iopub(self, parent_id: str, idents: list[bytes], msg_list: list[bytes]) -> None:
        original = self._aliases.get(parent_id)
        if original is not None:
            msg = self._verify_quiet(msg_list)
            if msg is not None:
                self._send_iopub({**msg, "parent_header": original, "buffers": msg_list[5:]},
                                 idents)
            return
        self._publish([*idents, b"<IDS|MSG>", *msg_list])

