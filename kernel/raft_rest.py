"""A Raft group that rests while nothing is written to its log.

An awake pysyncobj group costs about 30 ms of CPU per second for three replicas doing nothing
(docs/performance.md): the leader's heartbeats, 20 a second, each answered by every follower, and
everyone's 50 ms ticks. Production systems quiesce idle groups (CockroachDB quiesces idle ranges,
TiKV hibernates idle regions); this module does the same for one kernel's group:

1. A follower that has seen no log activity (index, commit, term, leader, role) for
   ``follower_quiet`` seconds, is caught up and connected to its leader, *rests*: its election
   timeout becomes ``rest_election`` (longer than the rest heartbeat period), its tick thread
   sleeps until a message or its election deadline (``RestingPoller``), and it tells the leader
   with an ``nbos_rest`` message (term and log index).
2. A leader that has heard ``nbos_rest`` for its current term and log index from every other
   member, all connected and caught up, and has itself been quiet ``leader_quiet`` seconds, rests:
   one heartbeat every ``rest_heartbeat`` seconds instead of every 50 ms (a hung leader is still
   found by the followers' election timeout), no tick in between, a longer
   ``leaderFallbackTimeout`` and connection timeout.
3. Anything but a rest heartbeat and its answer wakes a resting replica at once: a proposal (it
   enters the log), any other Raft message, a member connecting or disconnecting, a role or term
   change. A replica that wakes restores its timings and sends ``nbos_wake`` to the others it
   knows (a leader to every member, a follower to its leader), so the whole group wakes together
   and the next cell pays nothing. A SIGKILLed leader closes its sockets: the followers wake on
   the disconnect and elect at once (point 4; the Local Scheduler reports the death as well). A hung-but-alive leader of a resting group is found by the rest election
   timeout instead of the normal one.
4. A follower that loses its connection to the leader (a SIGKILLed replica's sockets close at
   once) elects now, awake or resting, instead of after the election timeout (0.25-0.6 s, which
   put failover over 0.5 s in a third of the tries): the survivors wait
   ``leader_lost_election`` plus ``leader_lost_stagger`` times their rank among the members left
   (sorted by address), so one asks first and wins without a split vote; if its log is behind,
   the next one's turn comes ``leader_lost_stagger`` later.

Only the timing changes: the log, its commits and Raft's safety rules are pysyncobj's own. The
messages are sent on pysyncobj's transport (encrypted with the group's password) and caught by
``RestingTransport`` before pysyncobj sees them. Everything here runs on pysyncobj's tick thread.
pysyncobj keeps its times on its own clock, ``CLOCK_MONOTONIC_RAW`` (``raft_clock``), which
drifts from ``time.monotonic()`` (0.25 s after 43 minutes of this VM's uptime): every time
written into pysyncobj's state is read from that clock.
pysyncobj keeps its state in name-mangled attributes; they are read (and the few timing fields
written) here only, and if a pysyncobj release lacks one of them resting is switched off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.transport import TCPTransport

from .raft_random import RAFT_RANDOM

log = logging.getLogger(__name__)

REST = "nbos_rest"
WAKE = "nbos_wake"
_LEADER, _FOLLOWER = 2, 0  # pysyncobj's _RAFT_STATE values
_NEEDED = ("raftLog", "raftCommitIndex", "raftLastApplied", "raftState", "raftLeader",
           "raftCurrentTerm", "raftElectionDeadline", "newAppendEntriesTime", "raftMatchIndex",
           "otherNodes", "connectedNodes", "conf", "transport", "selfNode")


def _address(node: Any) -> str:
    return str(getattr(node, "address", node))


@dataclass(frozen=True)
class RestTimings:
    """How a group rests. A resting replica's tick thread sleeps in ``poll`` until the next thing
    it has to do (``RestingPoller``): the leader until its next rest heartbeat, a follower until
    its election deadline, every one of them until a message or a connection event. Each wake-up
    of the tick thread costs about 0.4 ms of CPU on the 2-core VM (a Fernet-encrypted message
    decoded, pysyncobj's tick), so a group of three wakes about five times a ``rest_heartbeat``
    (the leader's heartbeat, two answers, two followers). While resting, every connection's
    timeout is ``rest_connection_timeout`` (pysyncobj drops a link that read nothing for its
    timeout, checked on its next send); a waking replica restores the normal one
    (docs/performance.md: with a 3 s tick and a 4 s heartbeat an idle notebook's three replicas
    spent 0.8-0.9 ms/s, issue 36).

    A resting group still notices failures: a SIGKILLed replica's sockets close at once (every
    peer wakes on the disconnect); a hung-but-alive leader is found by the followers' rest
    election timeout (``rest_election_min``-``max``), or as soon as a cell wakes the group (the
    woken followers use the normal 0.25-0.6 s timeout again). The Global Scheduler learns of a
    replica's death from its Local Scheduler, not from Raft."""

    follower_quiet: float = 1.0
    leader_quiet: float = 1.0
    rest_heartbeat: float = 30.0
    rest_tick: float = 90.0  # the longest a resting tick thread sleeps with nothing due
    rest_election_min: float = 75.0
    rest_election_max: float = 90.0
    rest_fallback: float = 150.0
    rest_connection_timeout: float = 150.0
    fallback_grace: float = 1.0  # a woken leader keeps the long fallback this long
    leader_lost_election: float = 0.02
    leader_lost_stagger: float = 0.1


class RestingTransport(TCPTransport):
    """pysyncobj's TCP transport, with the rest messages and wake-ups routed to ``rest``."""

    rest: RaftRest | None = None

    def _onMessageReceived(self, node, message) -> None:  # noqa: N802 - pysyncobj's name
        rest = self.rest
        if rest is not None and rest.on_message(node, message):
            return
        super()._onMessageReceived(node, message)

    def _onNodeConnected(self, node) -> None:  # noqa: N802
        super()._onNodeConnected(node)
        if self.rest is not None:
            self.rest.wake("connected")

    def _onNodeDisconnected(self, node) -> None:  # noqa: N802
        # a failed attempt to reach a member that is down reports a disconnect too (every
        # connectionRetryTime): only losing a connected member is news
        rest = self.rest
        was_connected = rest is not None and rest.is_connected(node)
        super()._onNodeDisconnected(node)
        if was_connected:
            rest.wake("disconnected")
            rest.leader_lost(node)

    def touch_connections(self) -> None:
        """Count now as a read on every connection: a link that carried nothing because the
        group rested (follower to follower) is not dead, and pysyncobj would otherwise drop it,
        and the message sent on it, on its first use after the connection timeout."""
        now = raft_clock()
        for conn in list(self._connections.values()):
            if hasattr(conn, "_TcpConnection__lastReadTime"):
                conn._TcpConnection__lastReadTime = now


class RestingPoller:
    """pysyncobj's poller, whose ``poll`` (the tick thread's only wait) sleeps until the next
    thing due while the group rests, instead of ``autoTickPeriod``: pysyncobj reads that period
    before a tick, while the rest heartbeat and the election deadline are only known after it."""

    def __init__(self, inner: Any, rest: RaftRest) -> None:
        self._inner = inner
        self._rest = rest

    def subscribe(self, descr, callback, eventMask) -> None:  # noqa: ANN001, N803
        self._inner.subscribe(descr, callback, eventMask)

    def unsubscribe(self, descr) -> None:  # noqa: ANN001
        self._inner.unsubscribe(descr)

    def poll(self, timeout: float) -> None:
        self._inner.poll(self._rest.poll_timeout(timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RaftRest:
    """The resting state machine of one replica (see the module docstring)."""

    def __init__(self, sync: Any, timings: RestTimings | None = None) -> None:
        self._sync = sync
        self.timings = timings or RestTimings()
        self.enabled = all(hasattr(sync, f"_SyncObj__{name}") for name in _NEEDED)
        if not self.enabled:
            log.warning("this pysyncobj lacks the state a resting group needs: never resting")
            return
        conf = self._get("conf")
        self._normal = {
            "autoTickPeriod": conf.autoTickPeriod,
            "appendEntriesPeriod": conf.appendEntriesPeriod,
            "raftMinTimeout": conf.raftMinTimeout,
            "raftMaxTimeout": conf.raftMaxTimeout,
            "leaderFallbackTimeout": conf.leaderFallbackTimeout,
        }
        self.resting = False
        self.rests = 0  # times this replica entered rest (status, tests)
        # called on the tick thread each time this replica comes to rest (the replica gives its
        # free heap back then, heap_trim.py); an exception is logged, never raised into pysyncobj
        self.on_rest: Callable[[], None] | None = None
        self._snapshot: tuple = ()
        self._last_activity = raft_clock()
        self._woke_at = 0.0
        self._announced: dict[Any, tuple[int, int]] = {}  # leader: follower -> (term, index)
        self._wake_requested = False  # set by any thread (request_wake), read on the tick thread
        self.poller: RestingPoller | None = None
        if hasattr(sync, "_poller"):
            self.poller = sync._poller = RestingPoller(sync._poller, self)
        sync.addOnTickCallback(self.on_tick)

    # ---- pysyncobj's state ---------------------------------------------------------------
    def _get(self, name: str) -> Any:
        return getattr(self._sync, f"_SyncObj__{name}")

    def _set(self, name: str, value: Any) -> None:
        setattr(self._sync, f"_SyncObj__{name}", value)

    def _log_index(self) -> int:
        return self._get("raftLog")[-1][1]

    def _state(self) -> tuple:
        return (self._log_index(), self._get("raftCommitIndex"), self._get("raftLastApplied"),
                self._get("raftState"), self._get("raftLeader"), self._get("raftCurrentTerm"))

    def _caught_up(self) -> bool:
        index = self._log_index()
        return self._get("raftCommitIndex") == index and self._get("raftLastApplied") == index

    def is_connected(self, node: Any) -> bool:
        return self.enabled and node in self._get("connectedNodes")

    def poll_timeout(self, timeout: float) -> float:
        """How long the tick thread may wait for a message now: ``timeout`` (pysyncobj's tick
        period) while awake; resting, until this replica's next duty (the leader's heartbeat, a
        follower's election deadline), at least the normal tick and at most ``rest_tick``."""
        if not self.enabled or not self.resting:
            return timeout
        now = raft_clock()
        if self._get("raftState") == _LEADER:
            due = self._get("newAppendEntriesTime")
        else:
            due = self._get("raftElectionDeadline")
        return min(max(due - now, self._normal["autoTickPeriod"]), self.timings.rest_tick)

    def _connection_timeouts(self, timeout: float) -> None:
        """Every connection's timeout (pysyncobj checks it on a send: a link that read nothing
        for that long is dropped)."""
        transport = self._get("transport")
        for conn in list(getattr(transport, "_connections", {}).values()):
            if hasattr(conn, "_TcpConnection__timeout"):
                conn._TcpConnection__timeout = timeout

    # ---- events (tick thread) ---------------------------------------------------------------
    def on_tick(self) -> None:
        if not self.enabled:
            return
        if self._wake_requested:
            self._wake_requested = False
            self.wake("a local proposal")
        state = self._state()
        if state != self._snapshot:
            self._snapshot = state
            self.wake("log or role changed")
        now = raft_clock()
        conf = self._get("conf")
        if (not self.resting and self._woke_at
                and now - self._woke_at > self.timings.fallback_grace
                and conf.leaderFallbackTimeout != self._normal["leaderFallbackTimeout"]):
            conf.leaderFallbackTimeout = self._normal["leaderFallbackTimeout"]
        if self.resting:
            return
        role = self._get("raftState")
        if role == _FOLLOWER and now - self._last_activity >= self.timings.follower_quiet:
            self._maybe_rest_follower()
        elif role == _LEADER and now - self._last_activity >= self.timings.leader_quiet:
            self._maybe_rest_leader()

    def on_message(self, node: Any, message: Any) -> bool:
        """True when the message was ours (pysyncobj must not see it)."""
        if not self.enabled or not isinstance(message, dict):
            return False
        kind = message.get("type")
        if kind == REST:
            if self._get("raftState") == _LEADER:
                self._announced[node] = (message.get("term"), message.get("index"))
            return True
        if kind == WAKE:
            self.wake("asked by a peer")
            return True
        if self.resting:
            if self._get("raftState") == _LEADER:
                quiet = kind == "next_node_idx"  # a follower answering a rest heartbeat
            else:
                quiet = (kind == "append_entries" and not message.get("entries")
                         and not message.get("serialized") and not message.get("transmission")
                         and message.get("commit_index") == self._get("raftCommitIndex"))
            if not quiet:
                self.wake(f"message {kind}")
        return False

    def request_wake(self) -> None:
        """From any thread, before a proposal: wake on the tick thread's next tick (pysyncobj
        wakes its poller for the proposal). A follower forwards a proposal to its leader, which
        changes nothing in its own log: without this, a resting follower whose leader hung would
        wait out the rest election timeout before the cell could run."""
        if self.enabled:  # whether it rests is read on the tick thread (it may rest meanwhile)
            self._wake_requested = True

    def wake(self, why: str) -> None:
        if not self.enabled:
            return
        self._last_activity = raft_clock()
        if not self.resting:
            if self._announced:  # followers rest on our word: have them start over
                transport = self._get("transport")
                for node in list(self._announced):
                    transport.send(node, {"type": WAKE})
                self._announced.clear()
            return
        self._announced.clear()
        self.resting = False
        self._woke_at = self._last_activity
        log.debug("raft group wakes: %s", why)
        conf = self._get("conf")
        for key in ("autoTickPeriod", "appendEntriesPeriod", "raftMinTimeout", "raftMaxTimeout"):
            setattr(conf, key, self._normal[key])
        transport = self._get("transport")
        if isinstance(transport, RestingTransport):
            transport.touch_connections()
        self._connection_timeouts(conf.connectionTimeout)
        if self._get("raftState") == _LEADER:
            self._set("newAppendEntriesTime", 0.0)  # a heartbeat on this very tick
            peers = self._get("otherNodes")
        else:
            self._set("raftElectionDeadline", raft_clock() + RAFT_RANDOM.uniform(
                self._normal["raftMinTimeout"], self._normal["raftMaxTimeout"]))
            leader = self._get("raftLeader")
            peers = [leader] if leader is not None else self._get("otherNodes")
        for node in list(peers):
            transport.send(node, {"type": WAKE})

    def leader_lost(self, node: Any) -> None:
        """``node``'s connection closed: if it led, elect soon (point 4 of the module's
        docstring)."""
        if not self.enabled or self._get("raftState") != _FOLLOWER \
                or node != self._get("raftLeader"):
            return
        me = _address(self._get("selfNode"))
        left = sorted({_address(n) for n in self._get("otherNodes") if n != node} | {me})
        t = self.timings
        delay = t.leader_lost_election + t.leader_lost_stagger * left.index(me)
        self._set("raftElectionDeadline", raft_clock() + delay)
        log.debug("raft leader %s lost: electing in %.2fs", _address(node), delay)

    # ---- entering rest -----------------------------------------------------------------------
    def _maybe_rest_follower(self) -> None:
        leader = self._get("raftLeader")
        if leader is None or leader not in self._get("connectedNodes") or not self._caught_up():
            return
        conf = self._get("conf")
        t = self.timings
        conf.raftMinTimeout, conf.raftMaxTimeout = t.rest_election_min, t.rest_election_max
        self._set("raftElectionDeadline",
                  raft_clock() + RAFT_RANDOM.uniform(t.rest_election_min, t.rest_election_max))
        self._connection_timeouts(t.rest_connection_timeout)
        self.resting = True
        self.rests += 1
        self._get("transport").send(leader, {"type": REST, "term": self._get("raftCurrentTerm"),
                                             "index": self._log_index()})
        self._rested()

    def _maybe_rest_leader(self) -> None:
        index, term = self._log_index(), self._get("raftCurrentTerm")
        others = self._get("otherNodes")
        connected = self._get("connectedNodes")
        match = self._get("raftMatchIndex")
        if not others or not self._caught_up():
            return
        for node in others:
            if (node not in connected or match.get(node) != index
                    or self._announced.get(node) != (term, index)):
                return
        conf = self._get("conf")
        t = self.timings
        conf.appendEntriesPeriod = t.rest_heartbeat
        conf.leaderFallbackTimeout = t.rest_fallback
        self._set("newAppendEntriesTime", raft_clock() + t.rest_heartbeat)
        self._connection_timeouts(t.rest_connection_timeout)
        self.resting = True
        self.rests += 1
        self._rested()

    def _rested(self) -> None:
        if self.on_rest is None:
            return
        try:
            self.on_rest()
        except Exception:  # noqa: BLE001 - housekeeping: resting must not fail for it
            log.warning("on_rest failed", exc_info=True)
