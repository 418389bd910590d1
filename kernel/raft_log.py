"""The replicated log of one kernel, on pysyncobj.

One ``RaftLog`` per replica. ``propose(record)`` appends a typed record (``records.py``); every
committed record is applied to the replica's ``ElectionBook`` on pysyncobj's tick thread and handed
to ``on_commit``, both under ``lock`` (so ``on_commit`` must only schedule work, never block).

Configuration, on purpose (notes/ecosystem.md section 3):
- Raft traffic encrypted and authenticated (ChaCha20-Poly1305, ``raft_crypto.py``) with a key
  derived from the kernel's HMAC key (pysyncobj unpickles what it receives: without it anyone
  reaching the port runs code). The key is one SHA-256 of the kernel key (``raft_key``), not
  pysyncobj's ``password``: that stretches a password with 100,000 rounds of PBKDF2, 25-37 ms of
  CPU in every replica's start, which buys nothing for a random 256-bit key;
- no fork and no dump file: the log and snapshots stay in memory (``fullDumpFile=None``);
- dynamic membership, so a replacement replica joins fresh and catches up (snapshot + log);
- loopback-friendly timers, and the pipe notifier so a proposal is sent without waiting a tick.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj import pickle as pysyncobj_pickle

from .election import Applied, ElectionBook
from .raft_crypto import RaftCipher, raft_key
from .raft_io import install as use_quick_raft_reads
from .raft_random import keep_raft_off_the_users_generator
from .raft_rest import RaftRest, RestingTransport, RestTimings
from .raft_start import QuickStart
from .raft_wire import install as use_raft_wire_codec
from .records import LEAD, Completion, Proposal, Record

log = logging.getLogger(__name__)

CommitHandler = Callable[[Record, Applied], None]
DEFAULT_REST = RestTimings()
# A Completion that carries a state update is announced committed at once (``_nobody_waits_for``);
# NOTEBOOKOS_RAFT_ANNOUNCE_UPDATES=0 in a replica's environment gives the code before (with the
# next AppendEntries): for a test that needs the window in which a standby holds a committed
# Completion without knowing it, and for a before/after benchmark.
ANNOUNCE_UPDATES = os.environ.get("NOTEBOOKOS_RAFT_ANNOUNCE_UPDATES", "1") != "0"
TRANSIENT = frozenset({"MISSING_LEADER", "NOT_LEADER", "LEADER_CHANGED", "DISCARDED", "QUEUE_FULL"})


class _KeyedSyncObj(SyncObj):
    """pysyncobj's SyncObj with a ready encryptor instead of one derived from a password (its
    transport asks ``encryptor`` for every connection; ``_getEncryptor`` is the same)."""

    def __init__(self, *args, encryptor: RaftCipher, book_consumer: _BookConsumer,  # noqa: ANN002
                 on_diverged: Callable[[str], None] | None = None,
                 **kwargs) -> None:  # noqa: ANN003
        # Set before SyncObj's init: it starts the tick thread, and an attribute added after it
        # is part of every snapshot pysyncobj takes of this object (the book consumer is not
        # picklable: its handler belongs to the kernel).
        self._keyed_encryptor = encryptor
        self.book_consumer = book_consumer
        self.applied_guard = AppliedEntryGuard(on_diverged)
        super().__init__(*args, **kwargs)

    @property
    def encryptor(self) -> RaftCipher:
        return self._keyed_encryptor

    def _getEncryptor(self) -> RaftCipher:  # noqa: N802 - pysyncobj's name
        return self._keyed_encryptor

    def _SyncObj__onMessageReceived(self, node, message) -> None:  # noqa: ANN001, N802
        """pysyncobj's message handler, watched for the one step of it that can make this
        replica's state machine diverge: an AppendEntries whose ``prevLogIdx`` lies below the
        last applied index makes a follower delete every later entry, applied ones included
        (pysyncobj logs "truncating already-applied log entries ... may have diverged"), and
        append what the leader sent instead. Applied entries are never applied again, so the
        replica diverged exactly when an entry written back at an applied index differs from
        the one applied there (``AppliedEntryGuard``); the same entry sent again (a stale or
        repeated AppendEntries) is harmless and said so."""
        message, held_to = self._without_entries_held(message)
        guard = self.applied_guard
        guard.before(self, message)
        super()._SyncObj__onMessageReceived(node, message)
        guard.after(self, message)
        if held_to is not None:  # Raft's answer to an AppendEntries whose entries all match
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=held_to + 1, success=True)

    def _without_entries_held(self, message: Any) -> tuple[Any, int | None]:
        """An AppendEntries cut down to what this follower's log lacks, so that pysyncobj
        deletes entries only from the first one that conflicts with the leader's (Raft's rule),
        never entries that match.

        pysyncobj deletes every entry after ``prevLogIdx`` whenever it holds more, and first
        reverses the membership changes among them, without knowing whether each changed its
        view when appended: a joiner whose --peers named a live member reverses the log's
        "add <that member>" into removing it (and drops its connection), and a "remove <a
        replica long gone>" into adding the gone replica. A late or repeated AppendEntries
        (the leader moves its next index back on a stale "reset" answer, then resends what the
        follower holds, often in a shorter batch) left a joiner with such a view until the
        leader sent the rest again; it could not when the reversal had dropped the leader, nor
        once the leader (the executor) was SIGKILLed: two live replicas, neither with a
        quorum (issue 32, the notebook corpus with a kill after every cell).

        Entries are compared by index and term (Raft's Log Matching: the same index and term
        hold the same command, with the same log before them). An AppendEntries all of whose
        entries this log holds, and that ends before this log does, is a stale one: pysyncobj
        gets it without its entries (its term, leader and commit index, the commit capped at
        its last entry: this log's later entries may not be the leader's) and the leader gets
        Raft's answer, success up to its last entry, with ``held_to`` (returned). One that
        brings more is cut to what is new; one that conflicts is cut to start at the conflict,
        from which pysyncobj deletes, as Raft does. A large entry sent in parts is compared
        once whole (its last part). Anything else (a snapshot, a previous entry that does not
        match) is pysyncobj's, unchanged."""
        try:
            if (not isinstance(message, dict) or message.get("type") != "append_entries"
                    or "prevLogIdx" not in message or message.get("serialized") is not None
                    or message["term"] < self._SyncObj__raftCurrentTerm):
                return message, None  # not entries, or a message pysyncobj ignores
            if message.get("transmission") == "finish":
                # the last part of a large entry: pysyncobj would append it as one entry after
                # deleting all after prevLogIdx, the same way; whole, it is compared like others
                entry = pysyncobj_pickle.loads(self._SyncObj__recvTransmission + message["data"])
                self._SyncObj__recvTransmission = ""
                message = {k: v for k, v in message.items() if k not in ("transmission", "data")}
                message["entries"] = [entry]
            elif "transmission" in message:
                return message, None  # a part of a large entry: nothing is written yet
            prev, prev_term = message["prevLogIdx"], message["prevLogTerm"]
            last = self._SyncObj__getCurrentLogIndex()
            if prev >= last:
                return message, None  # nothing to delete
            held = self._SyncObj__getEntries(prev, last - prev + 1)
            if not held or held[0][1] != prev or held[0][2] != prev_term:
                return message, None  # compacted, or no match at prevLogIdx: pysyncobj's
            entries = list(message.get("entries") or [])
            matched = 0
            for entry, mine in zip(entries, held[1:], strict=False):
                if entry[1] != mine[1] or entry[2] != mine[2]:
                    break
                matched += 1
            if matched == 0 and entries and len(held) > 1:
                return message, None  # a conflict at the first entry: deleted from there
            rest = entries[matched:]
            if matched:
                prev, prev_term = entries[matched - 1][1], entries[matched - 1][2]
            if not rest and prev < last:  # stale: this log holds all it sent, and more
                bare = {k: v for k, v in message.items()
                        if k not in ("prevLogIdx", "prevLogTerm", "entries")}
                bare["commit_index"] = min(message["commit_index"], prev)
                return bare, prev
            if prev == message["prevLogIdx"]:
                return message, None
            trimmed = dict(message)
            trimmed.update(prevLogIdx=prev, prevLogTerm=prev_term, entries=rest)
            return trimmed, None
        except Exception:  # noqa: BLE001 - another pysyncobj: its own behaviour
            log.debug("could not compare an AppendEntries with the log", exc_info=True)
            return message, None

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 - pysyncobj's (mangled) name
        """pysyncobj's apply step. Without batching it answers True after every apply, and the
        leader then sends each member an AppendEntries carrying only the new commit index (and
        gets an answer from each): four messages per record, twice per cell, on two busy cores.
        When every record applied is one no member acts on at once (``_BookConsumer.lazy``),
        the commit index rides on the next AppendEntries instead: the next record's (sent at
        once) or the heartbeat, within ``appendEntriesPeriod`` (a group does not rest before
        its members have caught up, raft_rest.py)."""
        consumer = self.book_consumer
        try:
            before = self._SyncObj__raftLastApplied
        except AttributeError:  # another pysyncobj: its own behaviour
            return super()._SyncObj__applyLogEntries()
        consumer.lazy_applied = 0
        send = super()._SyncObj__applyLogEntries()
        applied = self._SyncObj__raftLastApplied - before
        if send and applied > 0 and consumer.lazy_applied == applied:
            return False
        return send


class AppliedEntryGuard:
    """Finds out whether pysyncobj replaced log entries this replica already applied.

    pysyncobj's follower deletes every entry after an AppendEntries' ``prevLogIdx`` whenever
    it holds more, without first checking that they conflict (Raft deletes only from the first
    conflicting entry), and only logs CRITICAL when applied entries go. Raft never changes a
    committed entry, so a leader that sends applied indexes again sends the same entries,
    and nothing diverged: that is the common case (an AppendEntries that arrives late, or
    again after the leader moved its next index back). If an entry written back at an applied
    index differs (another term or command), the replica's book holds a record the group does
    not, or lacks one it has: ``on_diverged(why)`` then runs once, on the tick thread (the
    replica exits to be replaced: kernel/replica.py). Runs only when an AppendEntries reaches
    below the applied index; the normal path costs a comparison."""

    def __init__(self, on_diverged: Callable[[str], None] | None) -> None:
        self.on_diverged = on_diverged
        # applied index -> the log's entry object there: pysyncobj appends a new tuple for
        # every entry it writes, so the same object means the entry was never deleted
        self.at_risk: dict[int, tuple] = {}
        self.diverged: str | None = None
        self.rewritten = 0  # applied entries deleted and written back unchanged (tests, logs)
        self._rewritten_logged = 0

    @staticmethod
    def _entries(sync: SyncObj, first: int, count: int) -> list[tuple]:
        return sync._SyncObj__getEntries(first, count) or []

    def before(self, sync: SyncObj, message: dict) -> None:
        if message.get("type") != "append_entries" or "prevLogIdx" not in message:
            return
        if message.get("transmission") in ("start", "process"):
            return  # a large entry in parts: nothing is written before its last part
        first = message["prevLogIdx"] + 1
        applied = sync._SyncObj__raftLastApplied
        if first > applied:
            return
        for entry in self._entries(sync, first, applied - first + 1):
            self.at_risk.setdefault(entry[1], entry)

    def after(self, sync: SyncObj, message: dict) -> None:
        if not self.at_risk:
            return
        if message.get("type") == "append_entries" and message.get("serialized") is not None:
            self.at_risk.clear()  # a snapshot replaced the log and the book (on_restore)
            return
        try:
            last = sync._SyncObj__getCurrentLogIndex()
            first_log = sync._SyncObj__raftLog[0][1]
        except (AttributeError, IndexError):
            return
        for idx in sorted(self.at_risk):
            if idx > last:
                break  # deleted, not (yet) written back: the next AppendEntries brings it
            if idx < first_log:  # compacted meanwhile: was committed, nothing to compare
                del self.at_risk[idx]
                continue
            entries = self._entries(sync, idx, 1)
            if not entries:
                continue
            was = self.at_risk.pop(idx)
            now = entries[0]
            if now is was:
                continue  # never deleted (pysyncobj ignored the message or kept its log)
            if now[0] == was[0] and now[2] == was[2]:
                self.rewritten += 1
                continue
            self._diverge(f"the log entry at index {idx}, applied here (term {was[2]}), was "
                          f"replaced by another (term {now[2]}) from the Raft leader")
            return
        if not self.at_risk and self.rewritten > self._rewritten_logged:
            # a warning, next to pysyncobj's CRITICAL line in the replica's log: that one
            # says the state machine may have diverged, this one that it did not
            log.warning("the %d applied log entries pysyncobj truncated came back unchanged: "
                        "this replica did not diverge", self.rewritten - self._rewritten_logged)
            self._rewritten_logged = self.rewritten

    def _diverge(self, why: str) -> None:
        self.at_risk.clear()
        if self.diverged is not None:
            return
        self.diverged = why
        log.error("this replica's Raft state machine diverged from its group: %s", why)
        if self.on_diverged is not None:
            self.on_diverged(why)


class _BookConsumer(SyncObjConsumer):
    """Holds the replicated ElectionBook; pysyncobj snapshots whatever this object serialises."""

    def __init__(
        self,
        members: dict[int, str],
        on_commit: CommitHandler,
        on_restore: Callable[[], None],
        self_address: str = "",
    ) -> None:
        # attributes set before SyncObjConsumer.__init__ are local, never serialised
        self._self_address = self_address
        self._on_commit = on_commit
        self._on_restore = on_restore
        self.lock = threading.RLock()
        self.lazy_applied = 0  # records applied in this apply step that no member waits for
        super().__init__()
        self.book = ElectionBook(members)

    @replicated
    def commit(self, record: Record) -> bool:
        with self.lock:  # the handler runs under the lock too: book and handler stay in step
            try:
                applied = self.book.apply(record)
            except Exception:  # noqa: BLE001 - a bad record must not kill the tick thread
                log.exception("could not apply log record %r", record)
                return False
            try:
                self._on_commit(record, applied)
            except Exception:  # noqa: BLE001
                log.exception("commit handler failed for %r", record)
            if _nobody_waits_for(record, applied) and self._proposed_here(record):
                self.lazy_applied += 1
        return True

    def _proposed_here(self, record: Completion | Proposal) -> bool:
        """Whether this replica proposed ``record``. Only the leader's answer matters (it alone
        sends AppendEntries): a record it proposed itself is one whose proposer is not waiting
        for the news. An executor that is a follower (the transfer of leadership to it was
        refused) waits for its LEAD to commit: told a heartbeat late, the cell took 50 ms more."""
        proposer = record.executor if isinstance(record, Completion) else record.replica_id
        return self.book.members.get(proposer) == self._self_address

    def _deserialize(self, data):  # a snapshot from the leader replaces the whole book
        with self.lock:
            super()._deserialize(data)
        try:
            self._on_restore()
        except Exception:  # noqa: BLE001
            log.exception("snapshot restore handler failed")


def _nobody_waits_for(record: Record, applied: Applied) -> bool:
    """Records of a cell on the replica that ran the previous one, which the other members
    need not learn committed at once: its LEAD, which decided the election alone (the standbys
    were not asked, or learn it with the next record), and its Completion when it carries no
    state update (anyone's next record tells them), provided the leader proposed them itself
    (``_BookConsumer._proposed_here``). A Completion with an update is announced at once: the
    standbys have state to apply, and told with the next record (the checkpoint's, a write
    later, or a heartbeat) they held the cell's state 1-50 ms later than they could (issue
    36, the state-sync figure). Every other record (proposals and votes of a contested
    election, aborts, membership, checkpoints) is announced at once: members are waiting
    for it."""
    if isinstance(record, Completion):
        return record.update is None or not ANNOUNCE_UPDATES
    return isinstance(record, Proposal) and record.kind == LEAD and applied.decided


class RaftLog:
    """A replica's handle on the kernel's Raft group."""

    def __init__(
        self,
        self_address: str,
        peer_addresses: list[str],
        members: dict[int, str],
        kernel_key: bytes | str,
        on_commit: CommitHandler,
        on_restore: Callable[[], None] = lambda: None,
        on_ready: Callable[[], None] | None = None,
        raft_min_timeout: float = 0.25,
        raft_max_timeout: float = 0.6,
        compaction_entries: int = 5000,
        rest: RestTimings | None = DEFAULT_REST,
        quick_start: bool = False,
        on_diverged: Callable[[str], None] | None = None,
    ) -> None:
        keep_raft_off_the_users_generator()
        use_raft_wire_codec()  # small messages unzipped (raft_wire.py)
        use_quick_raft_reads()  # no SO_ERROR query or EAGAIN read per message (raft_io.py)
        """``quick_start``: this replica founds a new group (not ``--join``): its first
        election need not wait pysyncobj's timeouts (raft_start.py). ``on_diverged(why)``: an
        entry this replica applied was replaced in its log (``AppliedEntryGuard``), on
        pysyncobj's tick thread."""
        check_bindable(self_address)
        self.self_address = self_address
        self._closed = False
        self._consumer = _BookConsumer(members, on_commit, on_restore, self_address)
        conf = SyncObjConf(
            fullDumpFile=None,
            journalFile=None,
            useFork=False,
            dynamicMembershipChange=True,
            autoTick=True,
            # a tick when nothing happens (proposals and messages wake the poller at once): the
            # tick thread is what an idle replica spends CPU on (0.01 s: 15-20 ms/s per replica,
            # 0.05 s: 10-17 ms/s); heartbeats go out on ticks, so keep it <= appendEntriesPeriod
            autoTickPeriod=0.05,
            appendEntriesUseBatch=False,  # wake the tick thread on each proposal
            appendEntriesPeriod=0.05,
            raftMinTimeout=raft_min_timeout,
            raftMaxTimeout=raft_max_timeout,
            connectionTimeout=10.0,  # a busy executor (GIL held by a big pickle) is not dead;
            # a killed one closes its sockets and is seen at once
            connectionRetryTime=0.2,
            # a peer named by a replica container (docker launcher) may not resolve until its
            # container exists: retry the lookup soon instead of after pysyncobj's default 30 s
            dnsFailCacheTime=0.5,
            leaderFallbackTimeout=5.0,
            commandsWaitLeader=True,
            onReady=on_ready,
            logCompactionMinEntries=compaction_entries,  # then a joiner gets a snapshot
        )
        if os.environ.get("NOTEBOOKOS_RAFT_REST", "1") == "0":  # benchmarks/idle.py --awake
            rest = None
        transport = RestingTransport if rest is not None else None
        self._sync = _KeyedSyncObj(self_address, peer_addresses, conf,
                                   consumers=[self._consumer],
                                   encryptor=RaftCipher(raft_key(kernel_key)),
                                   book_consumer=self._consumer, on_diverged=on_diverged,
                                   **({"transportClass": transport} if transport else {}))
        # an idle group rests (raft_rest.py): almost no heartbeats while nothing is proposed
        self.rest: RaftRest | None = None
        if rest is not None:
            self.rest = RaftRest(self._sync, rest)
            self._sync._SyncObj__transport.rest = self.rest
        self.quick_start: QuickStart | None = None
        if quick_start:
            self.quick_start = QuickStart(self._sync, self_address, peer_addresses)

    @property
    def lock(self) -> threading.RLock:
        return self._consumer.lock

    @property
    def book(self) -> ElectionBook:
        return self._consumer.book

    def propose(
        self,
        record: Record,
        on_done: Callable[[bool, str], None] | None = None,
        retry_for: float = 60.0,
    ) -> None:
        """Append ``record``; ``on_done(ok, reason)`` runs once it commits or finally fails.

        Transient failures (no Raft leader yet, leader changed) are retried for ``retry_for``
        seconds. A retried record may commit twice; every record type is idempotent in the book.
        """
        deadline = time.monotonic() + retry_for

        def callback(result, error):
            ok = error == FAIL_REASON.SUCCESS
            reason = "" if ok else _fail_name(error)
            if not ok and reason in TRANSIENT and time.monotonic() < deadline and not self._closed:
                timer = threading.Timer(0.05, attempt)
                timer.daemon = True
                timer.start()
                return
            if not ok:
                log.warning("log record %s not committed: %s", type(record).__name__, reason)
            if on_done is not None:
                on_done(ok, reason)

        def attempt():
            if not self._closed:
                if self.rest is not None:
                    self.rest.request_wake()
                self._consumer.commit(record, callback=callback)

        attempt()

    def transfer_leadership_to(self, address: str) -> None:
        """Best effort, from the tick thread: make ``address`` the Raft leader if we lead now.

        The executor's own proposals then commit in one round trip instead of two.
        """
        if address == self.self_address or not self._sync._isLeader():
            return
        try:
            self._sync.transferLeadership(address)
        except Exception:  # noqa: BLE001 - an optimisation only
            log.debug("leadership transfer to %s failed", address, exc_info=True)

    def is_connected(self, address: str) -> bool:
        if address == self.self_address:
            return True
        try:
            return bool(self._sync.isNodeConnected(_node(address)))
        except Exception:  # noqa: BLE001 - unknown node
            return False

    def is_ready(self) -> bool:
        return bool(self._sync.isReady())

    def is_resting(self) -> bool:
        """Whether this replica's Raft timers rest (raft_rest.py)."""
        return self.rest is not None and self.rest.resting

    def leader_address(self) -> str | None:
        """The Raft address of the leader this replica last heard of (None while none)."""
        node = self._sync._getLeader()
        return getattr(node, "address", None) if node is not None else None

    def has_quorum(self) -> bool:
        return bool(self._sync.hasQuorum)

    def add_node(self, address: str, on_done: Callable[[bool, str], None]) -> None:
        self._sync.addNodeToCluster(
            address, callback=lambda _r, err: on_done(err == FAIL_REASON.SUCCESS, _fail_name(err))
        )

    def remove_node(self, address: str, on_done: Callable[[bool, str], None]) -> None:
        self._sync.removeNodeFromCluster(
            address, callback=lambda _r, err: on_done(err == FAIL_REASON.SUCCESS, _fail_name(err))
        )

    def log_end(self) -> tuple[int, int]:
        """(term, index) of the last entry in this replica's log, committed or not: what Raft
        compares to decide which log is the most up to date (the vote rule)."""
        try:
            return (int(self._sync._SyncObj__getCurrentLogTerm()),
                    int(self._sync._SyncObj__getCurrentLogIndex()))
        except (AttributeError, IndexError):  # another pysyncobj
            return (0, 0)

    def unapplied_entries(self) -> int:
        """How many entries of this replica's log it has not applied (not yet learned committed)."""
        try:
            return max(0, int(self._sync._SyncObj__getCurrentLogIndex())
                       - int(self._sync._SyncObj__raftLastApplied))
        except (AttributeError, IndexError):  # another pysyncobj
            return 0

    def apply_unconfirmed_tail(self, timeout_s: float = 10.0) -> int:
        """Apply every entry of this replica's log that it has not yet learned was committed,
        and answer how many it applied. Only for a survivor of a group that lost its quorum,
        whose state is about to seed a rebuilt group: Raft would have committed those entries
        had a quorum remained (a new leader commits its whole log with the no-op it appends),
        and a leader that reached this replica with an entry had, with three replicas, a
        majority for it. The executor tells the standbys a Completion committed only with the
        next message (``_nobody_waits_for``): killed right after its cell, its last Completion
        sits here unapplied, and the rebuilt group would lose that cell (found by the notebook
        corpus). Does nothing while this replica has a quorum. Runs on pysyncobj's tick thread,
        the only one that applies entries."""
        if self.has_quorum():
            return 0
        sync = self._sync
        done = threading.Event()
        applied: list[int] = []

        def on_tick() -> None:
            if done.is_set():
                return
            try:
                before = sync._SyncObj__raftLastApplied
                end = sync._SyncObj__getCurrentLogIndex()
                if sync._SyncObj__raftCommitIndex < end:
                    sync._SyncObj__raftCommitIndex = end
                sync._SyncObj__applyLogEntries()
                applied.append(sync._SyncObj__raftLastApplied - before)
            except Exception:  # noqa: BLE001 - another pysyncobj: nothing applied
                log.exception("could not apply the log's unconfirmed entries")
            finally:
                done.set()

        sync.addOnTickCallback(on_tick)
        try:
            sync._SyncObj__pipeNotifier.notify()  # a resting tick thread sleeps: wake it
            done.wait(timeout_s)
        finally:
            sync.removeOnTickCallback(on_tick)
        if applied and applied[0]:
            log.warning("applied %d log entries this replica had not learned were committed "
                        "(its group lost its quorum; its state seeds the rebuilt group)",
                        applied[0])
        return applied[0] if applied else 0

    def raft_members(self) -> set[str]:
        """The addresses pysyncobj currently counts in the cluster (self included)."""
        prefix = "partner_node_status_server_"
        status = self._sync.getStatus()
        return {k[len(prefix):] for k in status if k.startswith(prefix)} | {self.self_address}

    def status(self) -> dict:
        return dict(self._sync.getStatus())

    def close(self) -> None:
        self._closed = True
        try:
            self._sync.destroy()
            # a resting tick thread sleeps up to a second: wake it so it sees the destroy now
            self._sync._SyncObj__pipeNotifier.notify()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            log.debug("raft destroy failed", exc_info=True)


def check_bindable(address: str) -> None:
    """Fail at start, with the address in the message, when the Raft port cannot be bound
    (pysyncobj would otherwise retry silently forever and the replica would never be ready)."""
    host, _, port = address.rpartition(":")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            raise OSError(f"cannot listen for Raft on {address}: {exc.strerror}") from exc


def _node(address: str):
    from pysyncobj.node import TCPNode

    return TCPNode(address)


def _fail_name(error) -> str:
    for name in ("SUCCESS", "QUEUE_FULL", "MISSING_LEADER", "DISCARDED", "NOT_LEADER",
                 "LEADER_CHANGED", "REQUEST_DENIED"):
        if getattr(FAIL_REASON, name) == error:
            return name
    return str(error)
