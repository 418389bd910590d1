"""The replica kernel: an IPythonKernel that runs a cell only when the group elects it.

Wiring only; the pieces live elsewhere:
- ``raft_log.RaftLog``: the replicated log (pysyncobj), applying records to an ``ElectionBook``;
- ``election``: the pure election state machine and the vote rule;
- ``state_sync.StateSync``: encoding after a cell, applying others' updates, checkpoints;
- ``replies``: the reply contents (standby, all-yielded, executor failed).

Threads: pysyncobj applies committed records on its tick thread; this class only records the
commit time, queues updates and wakes the asyncio loop. Everything that touches the user
namespace runs on the kernel's loop (or in a worker thread while no cell can run).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import zmq
from ipykernel.ipkernel import IPythonKernel
from jupyter_client.session import utcnow
from traitlets import Bool, Float, Int, Unicode

from . import heap_trim, replies, rng_state
from .background_work import BackgroundWork
from .election import Applied, Election, Phase, choose_vote
from .figures import PyplotSettle
from .gpu_glue import GpuGlue
from .held_replies import HeldReplies
from .interrupt_traceback import hide_handler_frame
from .peers import parse_peers
from .raft_log import RaftLog
from .records import (
    LEAD,
    YIELD,
    Abort,
    Checkpointed,
    Completion,
    MemberAdded,
    MemberRemoved,
    Proposal,
    Record,
    Restored,
    Vote,
)
from .state_sync import CHECKPOINT_AFTER_CHANGE_S, StateSync

T = TypeVar("T")

# Exit status of a replica that could not load the committed state: the scheduler replaces it.
DIVERGED_EXIT_CODE = 75
# The apply loop looks for work at least this often. Every commit, snapshot, restore and
# divergence wakes it (``_wake``/``_notify``); this is only a safety net, and every wake-up of an
# idle replica's main thread costs CPU: at 5 s it was a fifth of an idle replica's main-thread
# wake-ups and 0.1 ms/s of its CPU (issue 36).
APPLY_SAFETY_WAKE_S = 60.0
ANSWERS_KEPT = 512  # recent execute_replies kept to answer a request that comes again
# When the process became this replica (wall clock, time.time()): a prewarmed or forked process
# is told in its order (prewarm_main.run_order); else the process's own start.
LAUNCHED_AT_ENV = "NOTEBOOKOS_REPLICA_LAUNCHED_AT"
# ``restored_for``: the group starts from the checkpoint because its notebook wakes, not because
# its replicas were lost (the Global Scheduler sets NOTEBOOKOS_RESTORED_FOR for a wake)
RESTORED_FOR_HIBERNATION = "hibernation"
# Control requests answered at once, beside ipykernel's one-at-a-time control queue: the
# Global Scheduler's questions to a survivor before it rebuilds a group that lost its majority.
# In the queue they waited behind a membership change that could no longer commit (it waits up
# to ``membership_timeout``), the scheduler gave up on the survivor after 5 s, and the group was
# rebuilt from an older checkpoint than the survivor held (the fault campaign, seed 14: a
# double fault rolled a notebook back one cell). Both only read the state or write a copy of it.
UNQUEUED_CONTROL = frozenset({"replica_status_request", "write_checkpoint_request"})


def _msg_type(session, frames) -> str:  # noqa: ANN001 - a jupyter_client Session, ZMQ frames
    """The ``msg_type`` in a wire message's header, unverified (for routing only), or ''."""
    try:
        _idents, parts = session.feed_identities(frames, copy=False)
        header = parts[1]
        return str(json.loads(getattr(header, "bytes", header)).get("msg_type", ""))
    except (ValueError, IndexError, TypeError, AttributeError):
        return ""


def launched_at() -> float:
    """When this process became a replica (time.time())."""
    try:
        return float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        import psutil

        return psutil.Process().create_time()


class _NoShellChannelThread:
    """Stands in for ipykernel's shell-channel thread, which a replica does not run (see
    ``ReplicaKernelApp.init_sockets``): falsy, so ipykernel takes its single-thread paths, and
    its ``parent_thread`` is the main thread (ipykernel 7.4's ``do_execute`` reads it for
    top-level ``await`` cells without checking whether the thread exists)."""

    parent_thread = threading.main_thread()

    def __bool__(self) -> bool:
        return False


def _fingerprint(request: dict) -> str:
    """What tells a request sent again from another one that reuses its msg_id."""
    header = request.get("header") or {}
    return f"{header.get('session')}|{header.get('date')}"


def applied_members(raft: RaftLog) -> dict[int, str]:
    """The book's member map (called on the tick thread, which holds no lock here)."""
    with raft.lock:
        return dict(raft.book.members)


class ReplicaKernel(IPythonKernel):
    """One replica of a NotebookOS distributed kernel."""

    implementation = "notebookos"
    implementation_version = "0.1.0"

    replica_id = Int(1, help="This replica's id (unique within the kernel's group).").tag(
        config=True
    )
    raft_address = Unicode("", help="host:port this replica's Raft listens on.").tag(config=True)
    peers = Unicode(
        "", help="The other replicas: comma-separated id=host:port (e.g. 2=10.0.0.2:7001)."
    ).tag(config=True)
    kernel_id = Unicode("", help="The distributed kernel's id (store keys, logs).").tag(config=True)
    store_url = Unicode("", help="Large-object store URL (file://, redis://, s3://).").tag(
        config=True
    )
    election_timeout = Float(
        0.2, help="Seconds after the first committed LEAD before voting without missing proposals."
    ).tag(config=True)
    no_lead_timeout = Float(
        1.0,
        help="Seconds after the first committed proposal before failing an election with no LEAD.",
    ).tag(config=True)
    yield_delay = Float(
        0.05, help="Seconds a standby holds its YIELD back, expecting the sticky LEAD to decide."
    ).tag(config=True)
    executor_dead_after = Float(
        1.0, help="Seconds the executor may be unreachable mid-cell before the cell is aborted."
    ).tag(config=True)
    join = Bool(False, help="Join an existing group as a fresh replacement replica.").tag(
        config=True
    )
    restore_from_checkpoint = Bool(
        False, help="Rebuild the namespace from the store's checkpoint (all replicas were lost)."
    ).tag(config=True)
    restored_from_survivor = Unicode(
        "", help="With --restore-from-checkpoint: the checkpoint holds every cell this surviving "
        "replica of a group that had lost its quorum had applied (it was written on the Global "
        "Scheduler's request, or the store's was as recent); the first cell says so instead of "
        "announcing lost work.",
    ).tag(config=True)
    restored_for = Unicode(
        "", help="With --restore-from-checkpoint: why the group starts from the checkpoint when "
        "nothing was lost: 'hibernation' (a hibernated notebook wakes; its checkpoint holds its "
        "last cell, and the Global Scheduler tells the user that it woke). The first cell then "
        "announces no loss, only what could not be restored, if anything.",
    ).tag(config=True)
    restore_expected = Int(
        0, help="With --restored-for hibernation: the cell the checkpoint held when the "
        "notebook went to sleep. A checkpoint found older than that (a replica cut off from its "
        "group wrote an older one over it late) is announced as lost work, never silently.",
    ).tag(config=True)
    incarnation = Int(
        0, help="The kernel's incarnation: 0 at its start, raised by each restart (the Global "
        "Scheduler sets NOTEBOOKOS_INCARNATION). Checkpoints are fenced with (incarnation, "
        "execution_count): the store refuses a late write over a newer checkpoint, and a "
        "restarted kernel, counting from 1 again, is not fenced out by the old one's.",
    ).tag(config=True)
    cell_container = Bool(
        False, help="This replica is the container of one cell under a per-cell container policy "
        "(batch, lcp): restoring from the checkpoint is the plan, not a loss, so the first cell "
        "reports only names that could not be restored.",
    ).tag(config=True)
    raft_compaction_entries = Int(
        5000, help="Compact the Raft log (in-memory snapshot) beyond this many entries."
    ).tag(config=True)
    sync_threshold_bytes = Int(1 << 20, help="Values larger than this go to the store.").tag(
        config=True
    )
    diverged_exit_after = Float(
        30.0, help="Seconds a replica whose namespace is not the committed state (an update, "
        "large object or checkpoint it could not load) keeps trying to re-sync from the store "
        "before it exits so that the scheduler replaces it. It never executes meanwhile.",
    ).tag(config=True)
    membership_timeout = Float(
        20.0, help="Seconds an add_replica_request or remove_replica_request waits for its Raft "
        "membership change to commit before it answers NotebookOSMembershipChangeFailed.",
    ).tag(config=True)
    catch_up_timeout = Float(
        120.0, help="Seconds an elected executor waits to have applied every earlier cell's "
        "state before it aborts the cell (with a reason) instead of running it without them.",
    ).tag(config=True)

    msg_types = [*IPythonKernel.msg_types, "yield_request"]
    control_msg_types = [
        *IPythonKernel.control_msg_types,
        "yield_request",
        "add_replica_request",
        "remove_replica_request",
        "replica_status_request",
        "write_checkpoint_request",
    ]

    async def dispatch_control(self, msg) -> None:  # noqa: ANN001 - ZMQ frames
        """ipykernel's, except that ``UNQUEUED_CONTROL`` requests do not wait for the control
        request before them to finish (``process_control`` verifies each as usual)."""
        if _msg_type(self.session, msg) in UNQUEUED_CONTROL:
            await self.process_control(msg)
        else:
            await super().dispatch_control(msg)

    @property
    def kernel_info(self) -> dict[str, Any]:
        """ipykernel's, without drawing from the user's random generator (IPython's banner
        picks a random tip: rng_state.users_generator_untouched)."""
        with rng_state.users_generator_untouched():
            return super().kernel_info

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.shell_channel_thread:
            self.shell_channel_thread = _NoShellChannelThread()
        if not self.raft_address:
            raise ValueError("--raft-address host:port is required")
        self._peer_map = parse_peers(self.peers)
        if self.replica_id in self._peer_map:
            raise ValueError(f"--peers names this replica's own id {self.replica_id}")
        members = {self.replica_id: self.raft_address, **self._peer_map}
        # an interrupted cell's traceback without _on_sigint's frame, as a plain kernel's
        hide_handler_frame(self.shell, ReplicaKernel._on_sigint.__code__)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._change: asyncio.Future | None = None  # set by the next change (_next_change)
        # whether a wait other than the apply loop's holds ``_change`` (see ``_on_commit``)
        self._change_watched = False
        self.commit_wakes = 0  # commits that woke the kernel's loop (_on_commit; status, tests)
        self._group_waits = 0  # waits for the group under way: SIGINT is ignored meanwhile
        self._first_lead_at: dict[str, float] = {}
        self._first_proposal_at: dict[str, float] = {}
        self._voted: set[str] = set()
        self._aborts_sent: set[str] = set()
        self._unreachable_since: dict[int, float] = {}
        self._executed_here: set[str] = set()
        self._replied: set[str] = set()
        self._synced: set[str] = set()  # elections whose Completion this replica proposed
        # The execute_reply this replica sent for each recent request: a request that comes
        # again (a restarted Global Scheduler's front resending what a client resent) gets the
        # same reply again and never runs a second election (docs/kernel-protocol.md).
        self._answers: OrderedDict[str, tuple[str, replies.Reply]] = OrderedDict()
        self.held_replies: HeldReplies | None = None  # set in start(), on the shell socket
        self._applies: deque[tuple[str, bytes]] = deque()
        self._applies_pending = 0
        self._apply_lock = threading.Lock()
        self._restore_needed = False
        self._rebuilding = False
        # What this replica's namespace lacks of the committed state ({name: why}): an update it
        # could not apply, a large object it could not fetch, a checkpoint restored in part.
        # While non-empty it never proposes LEAD and never runs a cell; it re-syncs from the
        # store, or exits after ``diverged_exit_after`` so that a replacement joins.
        self._diverged: dict[str, str] = {}
        self._diverged_since: float | None = None
        self._resync_due = 0.0
        self._resync_failures = 0  # failed re-syncs in all (never reset: see ``_wait_turn``)
        self._resync_streak = 0  # failed re-syncs since the last success (the backoff)
        self.restore_notes: list[str] = []
        # where a restore from the checkpoint spent its time, told in the reply metadata of the
        # first cell this replica runs after it (``metadata.notebookos.restore``)
        self._restore_report: dict[str, float] | None = None
        self._restoring = bool(self.restore_from_checkpoint)
        # whether the namespace holds the store checkpoint a rebuilt group starts from: founders
        # of a rebuilt group load it at start; a replacement that joins one, before its updates
        self._base_loaded = bool(self.restore_from_checkpoint)
        self._raft_ready = threading.Event()
        self.sync = StateSync(
            store_url=self.store_url,
            hmac_key=bytes(self.session.key or b""),
            kernel_id=self.kernel_id or "kernel",
            threshold_bytes=self.sync_threshold_bytes,
            log=self.log,
            epoch=self.incarnation,
        )
        self.gpu = GpuGlue(self.log)
        self.raft = RaftLog(
            self.raft_address,
            list(self._peer_map.values()),
            members,
            kernel_key=bytes(self.session.key or b""),
            on_commit=self._on_commit,
            on_restore=self._on_snapshot,
            on_ready=self._raft_ready.set,
            compaction_entries=self.raft_compaction_entries,
            quick_start=not self.join,
            on_diverged=self._raft_diverged,
        )
        # what its cells left running, which hibernation must not end (background_work.py)
        self.background = BackgroundWork()
        # an idle replica gives back the heap its start and its last cell freed (heap_trim.py)
        self.heap_trims = 0
        self.heap_released_bytes = 0
        if self.raft.rest is not None:
            self.raft.rest.on_rest = self._release_free_heap
        self.log.info(
            "NotebookOS replica %s of kernel %s: raft %s, peers %s",
            self.replica_id, self.kernel_id, self.raft_address, self._peer_map,
        )

    def _release_free_heap(self) -> None:
        """On the Raft tick thread, as the group comes to rest: ``malloc_trim(0)``, unless a cell
        is still open here (its executor may be allocating; the rest after its Completion trims)."""
        if self.raft.book.open_ids or not heap_trim.available():
            return
        self.heap_released_bytes += heap_trim.release_free_heap()
        self.heap_trims += 1

    @property
    def _supports_kernel_subshells(self) -> bool:
        """No kernel subshells: they would run cells beside the group's elections."""
        return False

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._loop = asyncio.get_event_loop()
        if self.shell_stream is not None:  # replies for a scheduler that is away are kept
            self.held_replies = HeldReplies(self.shell_stream.socket, self.io_loop.call_later)
            self.shell_stream.on_send(self.held_replies.on_send)
        self.io_loop.add_callback(self._after_start)

    async def _after_start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._drain_task = self._loop.create_task(self._drain_applies())
        if self.restore_from_checkpoint:
            started_s = time.time() - launched_at()
            try:
                await self._restore_from_store(started_s)
            finally:
                self._restoring = False
                self._notify()

    async def do_shutdown(self, restart: bool) -> dict:
        self.raft.close()
        self.sync.close()
        result = super().do_shutdown(restart)  # a dict in ipykernel 7, awaitable in others
        return await result if inspect.isawaitable(result) else result

    # ---- commits (pysyncobj tick thread) ------------------------------------------------------
    def _on_commit(self, record: Record, applied: Applied) -> None:
        now = time.monotonic()
        if isinstance(record, Proposal):
            if record.election_id not in self._first_proposal_at:
                self._forget_old_elections()
            self._first_proposal_at.setdefault(record.election_id, now)
            if record.kind == LEAD:
                self._first_lead_at.setdefault(record.election_id, now)
        queued = False
        if applied.completed and applied.update is not None:
            election = applied.election
            if election is not None and election.executor != self.replica_id:
                self.sync.prefetch(applied.update)
                with self._apply_lock:
                    self._applies.append((election.election_id, applied.update))
                    self._applies_pending += 1
                queued = True
        if applied.decided and applied.election is not None:
            executor = applied.election.executor
            if executor is not None and executor in applied_members(self.raft):
                self.raft.transfer_leadership_to(applied_members(self.raft)[executor])
        if applied.ignored_completion and isinstance(record, Completion):
            election = applied.election
            if (
                record.executor == self.replica_id
                and election is not None
                and election.phase is Phase.ABORTED
            ):
                # The group aborted this cell while it ran here: our namespace now holds effects
                # nobody else has. Stop, so a replacement joins with the group's state.
                self.log.error(
                    "cell %s was aborted by the group while it ran here; exiting so this replica "
                    "cannot diverge", record.election_id,
                )
                sys.stderr.flush()
                os._exit(70)
        # The main thread is woken only when someone there has a use for this commit: an
        # update to apply, a wait on the group (an election, a checkpoint: they look at the
        # book), or a record other than a cell's proposal or completion (a restore, a member
        # change: the apply loop looks at those). A standby's apply loop, otherwise asleep,
        # was woken by every proposal and completion of every cell for nothing (issue 36).
        # The waits take ``_change`` (and set ``_change_watched``) before they look at the
        # state, and the state changed before this reads the flag: no wake is missed.
        if queued or self._change_watched or not isinstance(record, (Proposal, Completion)):
            self.commit_wakes += 1
            self._wake()

    def _raft_diverged(self, why: str) -> None:
        """pysyncobj replaced a log record this replica had applied (raft_log.py,
        ``AppliedEntryGuard``): its book (elections, counters, the updates it applied) may hold
        what the group does not. Nothing here can undo an applied record, so it exits like a
        replica that cannot load the committed state: the scheduler replaces it, and the
        replacement catches up from the group. On pysyncobj's tick thread, before the next
        record is applied."""
        self.log.error("replica %s: %s; its state may differ from the group's, so it exits to "
                       "be replaced", self.replica_id, why)
        sys.stderr.flush()
        os._exit(DIVERGED_EXIT_CODE)

    def _forget_old_elections(self, keep: int = 10_000) -> None:
        """Bound the local per-election bookkeeping (insertion-ordered dicts and sets)."""
        if len(self._first_proposal_at) < 2 * keep:
            return
        for eid in list(self._first_proposal_at)[:-keep]:
            self._first_proposal_at.pop(eid, None)
            self._first_lead_at.pop(eid, None)
            self._voted.discard(eid)
            self._aborts_sent.discard(eid)
            self._executed_here.discard(eid)
            self._replied.discard(eid)
            self._synced.discard(eid)

    def _on_snapshot(self) -> None:
        self._restore_needed = True
        self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._notify)

    def _notify(self) -> None:
        change, self._change = self._change, None
        self._change_watched = False
        if change is not None and not change.done():
            change.set_result(None)

    def _next_change(self, watch: bool = True) -> asyncio.Future:
        """What the next change sets (a commit, a snapshot, an applied update, a restore): take
        it before looking at the state, then ``_wait_for`` it. One future for every waiter,
        and no task per wait (``asyncio.wait_for`` made one each time, every 20 ms and on
        every commit, on the kernel's loop). ``watch``: the waiter looks at the book, so
        every commit wakes it (the apply loop passes False: only what it applies does)."""
        change = self._change
        if change is None:
            change = self._change = asyncio.get_running_loop().create_future()
        if watch:
            self._change_watched = True
        return change

    @staticmethod
    async def _wait_for(change: asyncio.Future, timeout: float) -> None:
        """Until ``change`` is set or ``timeout`` seconds pass."""
        if not change.done():
            await asyncio.wait((change,), timeout=timeout)

    async def _wait_change(self, timeout: float) -> None:
        """The apply loop's wait: woken by what it applies or loads, not by every commit."""
        await self._wait_for(self._next_change(watch=False), timeout)

    @contextlib.contextmanager
    def _waiting_for_group(self) -> Iterator[None]:
        """While the replica waits for the group, SIGINT (an interrupt) must not raise
        KeyboardInterrupt somewhere inside the event loop: that would kill the kernel. The
        handler installed for every request (``pre_handler_hook``) ignores it meanwhile."""
        self._group_waits += 1
        try:
            yield
        finally:
            self._group_waits -= 1

    def pre_handler_hook(self) -> None:
        """ipykernel's, which makes SIGINT raise KeyboardInterrupt while a request is handled:
        here, not while the replica waits for the group (``_waiting_for_group``). One handler
        for the whole request: switching handlers around every wait cost two signal() calls
        each, three waits a cell."""
        self.saved_sigint_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:  # noqa: ARG002 - a signal handler
        if self._group_waits:
            return
        raise KeyboardInterrupt

    # ---- applying others' state updates, in log order -----------------------------------------
    async def _drain_applies(self) -> None:
        while True:
            if self._restoring:
                # A founder of a rebuilt group applies the log only on top of the checkpoint:
                # an update applied before its restore assigns the checkpoint's names would be
                # overwritten by them, silently (updates wait in order; _after_start wakes us).
                await self._wait_change(APPLY_SAFETY_WAKE_S)
                continue
            if self._diverged and not self._restoring and time.monotonic() >= self._resync_due:
                self._rebuilding = True
                try:
                    await self._resync()
                finally:
                    self._rebuilding = False
                    self._notify()
                continue
            if self._needs_base_checkpoint():
                self._rebuilding = True
                try:
                    await self._load_base_checkpoint()
                finally:
                    self._rebuilding = False
                    self._notify()
                continue
            if self._restore_needed:
                self._rebuilding = True
                self._restore_needed = False
                try:
                    await self._rebuild_after_snapshot()
                finally:
                    self._rebuilding = False
                    self._notify()
                continue
            with self._apply_lock:
                item = self._applies.popleft() if self._applies else None
            if item is None:
                # Every commit, snapshot and restore wakes this loop (_wake); the timeout is only
                # a safety net, long so that an idle replica's main thread sleeps (issue 18).
                wait = APPLY_SAFETY_WAKE_S
                if self._diverged:
                    wait = max(0.01, min(wait, self._resync_due - time.monotonic()))
                await self._wait_change(wait)
                continue
            election_id, update = item
            figures = PyplotSettle()
            try:
                if self.sync.is_light(update):  # no thread hop for the common small update
                    failures = self.sync.apply_checked(self.shell.user_ns, update)
                else:
                    failures = await asyncio.to_thread(
                        self.sync.apply_checked, self.shell.user_ns, update
                    )
                # a later update that sets a name again repairs it
                self._repaired(self.sync.entry_names(update) - set(failures))
                if failures:
                    self._mark_diverged(failures, f"the state update of {election_id}")
            finally:
                figures.settle()
                with self._apply_lock:
                    self._applies_pending -= 1
                self._notify()

    def _needs_base_checkpoint(self) -> bool:
        """A replacement that joined a group rebuilt from a store checkpoint: the group's log
        starts at that checkpoint (its ``Restored`` record), so what the checkpoint holds and no
        later cell changed (an imported module, a function) is only in the store. It is loaded
        before the first update of the log is applied (updates commit after ``Restored``)."""
        if self._base_loaded:
            return False
        with self.raft.lock:
            return self.raft.book.restored_from is not None

    async def _load_base_checkpoint(self) -> None:
        self._base_loaded = True
        figures = PyplotSettle()
        try:
            count, failed = await asyncio.to_thread(
                self.sync.restore_checkpoint, self.shell.user_ns
            )
        except Exception as exc:  # noqa: BLE001 - behind until a re-sync succeeds
            self._mark_diverged(
                {"<checkpoint>": f"{type(exc).__name__}: {exc}"},
                "the checkpoint this group was rebuilt from",
            )
            return
        finally:
            figures.settle()
        self._mark_diverged(self._unagreed({name: "not restored from the checkpoint"
                                            for name in failed}),
                            "the checkpoint this group was rebuilt from")
        self.log.info("joined a group rebuilt from a checkpoint: loaded the checkpoint of "
                      "cell %d before the log's updates", count)

    async def _rebuild_after_snapshot(self) -> None:
        """A Raft snapshot replaced the book: rebuild the namespace from the store's checkpoint
        plus the updates the book keeps after it; later records arrive through the queue."""
        failures = await self._rebuild_from_store("a Raft snapshot")
        self._mark_diverged(failures, "the rebuild after a Raft snapshot")

    async def _rebuild_from_store(self, why: str) -> dict[str, str]:
        """Load the committed state again: the store's checkpoint, then every update the book
        keeps after the checkpoint it records (updates queued meanwhile are among them). Returns
        ``{name: why}`` for what is still missing (names the group agreed were lost excepted)."""
        with self.raft.lock, self._apply_lock:  # atomic against the commit handler
            book = self.raft.book
            checkpoint_count = book.checkpoint_count
            has_checkpoint = bool(checkpoint_count) or book.restored_from is not None
            updates = [u for _c, _e, u in book.updates]
            self._applies.clear()
            self._applies_pending = 0
        self._base_loaded = True  # the store's checkpoint covers a rebuilt group's base
        self.log.info("loading the committed state (%s): checkpoint of cell %d + %d updates",
                      why, checkpoint_count, len(updates))
        figures = PyplotSettle()
        try:
            return await self._load_committed(has_checkpoint, updates)
        finally:
            figures.settle()

    async def _load_committed(self, has_checkpoint: bool, updates: list) -> dict[str, str]:
        failures: dict[str, str] = {}
        if has_checkpoint:
            try:
                _count, failed = await asyncio.to_thread(
                    self.sync.restore_checkpoint, self.shell.user_ns
                )
            except Exception as exc:  # noqa: BLE001 - the caller reports and retries
                return {"<checkpoint>": f"{type(exc).__name__}: {exc}"}
            failures.update({name: "not restored from the checkpoint" for name in failed})
        for update in updates:
            failed_now = await asyncio.to_thread(
                self.sync.apply_checked, self.shell.user_ns, update
            )
            for name in self.sync.entry_names(update) - set(failed_now):
                failures.pop(name, None)
            failures.update(failed_now)
        return self._unagreed(failures)

    def _unagreed(self, failures: dict[str, str]) -> dict[str, str]:
        """``failures`` less the names a rebuilt group agreed were lost (its users were told)."""
        with self.raft.lock:
            agreed = self.raft.book.restore_failed
        return {name: why for name, why in failures.items() if name not in agreed}

    # ---- behind or diverged: never the executor --------------------------------------------
    def _mark_diverged(self, failures: dict[str, str], source: str) -> None:
        if not failures:
            return
        for name, why in failures.items():
            self.log.error("replica %s lacks the committed state of %r (%s: %s); it will not "
                           "execute cells until it has re-synced", self.replica_id, name,
                           source, why)
        if not self._diverged:
            self._diverged_since = time.monotonic()
            self._resync_due = time.monotonic()
        self._diverged.update(failures)
        self._notify()

    def _repaired(self, names: set[str]) -> None:
        for name in names & self._diverged.keys():
            del self._diverged[name]
        if not self._diverged:
            self._diverged_since = None

    async def _resync(self) -> None:
        """Re-sync a diverged namespace from the store; exit (to be replaced) if that keeps
        failing for ``diverged_exit_after`` seconds."""
        failures = await self._rebuild_from_store(
            "re-sync of " + ", ".join(sorted(self._diverged)[:5])
        )
        if not failures:
            self.log.info("replica %s re-synced: its namespace is the committed state again",
                          self.replica_id)
            self._diverged.clear()
            self._diverged_since = None
            self._resync_streak = 0
            return
        if "<checkpoint>" in failures:  # nothing was reloaded: what was missing still is
            self._diverged.update(failures)
        else:
            self._diverged = dict(failures)
        self._resync_failures += 1
        self._resync_streak += 1
        delay = min(5.0, 0.25 * 2 ** self._resync_streak)
        self._resync_due = time.monotonic() + delay
        since = self._diverged_since or time.monotonic()
        self.log.error("replica %s: re-sync attempt %d failed for %s; next in %.1f s",
                       self.replica_id, self._resync_streak, sorted(failures), delay)
        if time.monotonic() - since >= self.diverged_exit_after:
            self.log.error(
                "replica %s could not load the committed state for %.0f s (%s); exiting so "
                "that the scheduler replaces it", self.replica_id, time.monotonic() - since,
                "; ".join(f"{k}: {v}" for k, v in sorted(failures.items())[:5]),
            )
            sys.stderr.flush()
            os._exit(DIVERGED_EXIT_CODE)

    def _behind(self) -> bool:
        """Whether state this replica must hold is still being loaded or applied."""
        with self._apply_lock:
            pending = self._applies_pending
        return bool(pending or self._restore_needed or self._rebuilding or self._restoring
                    or self._needs_base_checkpoint())

    async def _wait_turn(self, election: Election) -> str | None:
        """The elected executor runs the cell only once its namespace is the committed state:
        every earlier election settled and its update applied here, no load in progress, no
        divergence. Returns None when it may run, else why it must not."""
        deadline = time.monotonic() + self.catch_up_timeout
        failures_at_start = self._resync_failures

        def look() -> tuple[str | None] | None:
            nonlocal deadline
            with self.raft.lock:
                earlier = [e.election_id for e in self.raft.book.open_elections()
                           if e.term < election.term]
            if earlier:  # an earlier cell still runs (or is being decided): cells run in order,
                # however long it takes; the timeout is for loading state only
                deadline = time.monotonic() + self.catch_up_timeout
            elif not self._behind():
                if not self._diverged:
                    return (None,)
                if self._resync_failures > failures_at_start:
                    return ("it could not load the kernel's state (" + "; ".join(
                        f"{k}: {v}" for k, v in sorted(self._diverged.items())[:3]) + ")",)
            if time.monotonic() >= deadline:
                return (f"it had not caught up with the kernel's state after "
                        f"{self.catch_up_timeout:g} s",)
            return None

        (why_not,) = await self._watch_book(look)
        return why_not

    async def _restore_from_store(self, started_s: float) -> None:
        """Load the store's checkpoint, then agree with the group where counting resumes.
        ``started_s``: how long this replica took to start (``launched_at`` to its loop)."""
        figures = PyplotSettle()
        try:
            count, failed = await asyncio.to_thread(
                self.sync.restore_checkpoint, self.shell.user_ns
            )
        except Exception as exc:  # noqa: BLE001 - reported, the kernel starts empty
            self.log.error("could not restore from the checkpoint: %s", exc)
            self.restore_notes = [f"could not restore from the checkpoint: {exc}"]
            if not self.cell_container:
                return
            count, failed = 0, []  # a cell container tells its cell that it starts empty
        else:
            self.restore_notes = [f"{name!r} could not be restored" for name in failed]
        finally:
            figures.settle()
        self.log.info("restored the namespace of cell %d from the checkpoint", count)
        restored = time.monotonic()
        await self._wait_raft_ready(30.0)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.raft.propose(
            Restored(count, self.replica_id, tuple(self.restore_notes), tuple(failed)),
            on_done=lambda ok, why: loop.call_soon_threadsafe(
                lambda: done.done() or done.set_result(ok)
            ),
        )
        await done  # cells wait until every replica agrees where counting resumes
        self._restore_report = self._restore_split(started_s, time.monotonic() - restored)
        # The first committed Restored is the group's state: names it lost are lost here too;
        # names only this replica failed to restore leave it behind until it re-syncs.
        with self.raft.lock:
            agreed = self.raft.book.restore_failed
        self.sync.forget_names(self.shell.user_ns, set(agreed) - set(failed))
        self._mark_diverged(self._unagreed({name: "not restored from the checkpoint"
                                            for name in failed}), "the rebuild from checkpoint")

    def _restore_split(self, started_s: float, agree_s: float) -> dict[str, float]:
        """``metadata.notebookos.restore`` of the first cell after a restore (seconds): the
        replica's start, the checkpoint's read and apply (``RestoreSplit``), and the group's
        agreement on it (Raft ready, ``Restored`` committed)."""
        split = self.sync.last_restore
        return {"start_s": round(started_s, 4),
                "read_s": round(split.read_s, 4) if split else 0.0,
                "apply_s": round(split.apply_s, 4) if split else 0.0,
                "agree_s": round(agree_s, 4)}

    async def _wait_raft_ready(self, timeout: float) -> bool:
        """Until pysyncobj's tick thread says the group is ready (``on_ready``), or ``timeout``:
        waited on the event in a worker thread, not by looking every 10 ms."""
        if self._raft_ready.is_set():
            return True
        return await asyncio.to_thread(self._raft_ready.wait, timeout)

    # ---- the election ------------------------------------------------------------------------
    def _election(self, election_id: str) -> Election | None:
        with self.raft.lock:
            return self.raft.book.get(election_id)

    def _expected_proposers(self) -> set[int]:
        with self.raft.lock:
            members = dict(self.raft.book.members)
        return {rid for rid, addr in members.items() if self.raft.is_connected(addr)}

    def _tend_open_elections(self) -> None:
        """Vote where this replica can, and abort cells whose executor is gone."""
        now = time.monotonic()
        with self.raft.lock:
            book = self.raft.book
            open_ = book.open_elections()
            last_executor = book.last_executor
            members = dict(book.members)
        expected: set[int] | None = None
        for election in open_:
            eid = election.election_id
            if election.phase is Phase.PROPOSING and eid not in self._voted:
                if expected is None:
                    expected = self._expected_proposers()
                choice = choose_vote(
                    election, members, expected, last_executor, now,
                    self._first_lead_at.get(eid), self._first_proposal_at.get(eid),
                    self.election_timeout, self.no_lead_timeout,
                )
                if choice.ready and not self._should_vote(election, choice.candidate, now):
                    continue
                if choice.ready:
                    self._voted.add(eid)
                    self.raft.propose(Vote(eid, self.replica_id, choice.candidate))
            elif election.phase is Phase.RUNNING and election.executor != self.replica_id:
                self._watch_executor(election, members, now)

    def _should_vote(self, election: Election, candidate: int | None, now: float) -> bool:
        """LEAD proposers vote; others only to fail a LEAD-less election or to cover for a LEAD
        proposer that went quiet (fewer records on the critical path)."""
        if election.proposals.get(self.replica_id) == LEAD or candidate is None:
            return True
        first_lead = self._first_lead_at.get(election.election_id)
        return first_lead is not None and now - first_lead >= 2 * self.election_timeout + 0.1

    def _watch_executor(self, election: Election, members: dict[int, str], now: float) -> None:
        executor = election.executor
        assert executor is not None
        address = members.get(executor)
        if address is not None and self.raft.is_connected(address):
            self._unreachable_since.pop(executor, None)
            return
        since = self._unreachable_since.setdefault(executor, now)
        gone = address is None or now - since >= self.executor_dead_after
        if gone and election.election_id not in self._aborts_sent:
            self._aborts_sent.add(election.election_id)
            reason = (
                f"the replica executing this cell (replica {executor}) stopped responding "
                f"mid-cell"
            )
            self.raft.propose(Abort(election.election_id, self.replica_id, reason))

    async def _wait_until_quiet(self, election_id: str) -> None:
        """Wait until every other election is settled and its state update applied here."""
        await self._wait_raft_ready(30.0)

        def look() -> bool | None:
            with self.raft.lock:
                others = [
                    e for e in self.raft.book.open_elections() if e.election_id != election_id
                ]
            with self._apply_lock:
                pending = self._applies_pending
            quiet = not (others or pending or self._restore_needed or self._rebuilding
                         or self._restoring)
            return True if quiet else None

        await self._watch_book(look)

    async def _hold_yield(self, election_id: str) -> None:
        """A YIELD matters only to fail an election nobody leads, or when this replica ran the
        previous cell (its YIELD lets the first LEAD win at once). Otherwise hold it back for
        ``yield_delay``: the usual sticky LEAD decides first and the YIELD is never written."""
        with self.raft.lock:
            last_executor = self.raft.book.last_executor
        if last_executor == self.replica_id or last_executor is None:
            return
        deadline = time.monotonic() + self.yield_delay
        while time.monotonic() < deadline:
            change = self._next_change()
            election = self._election(election_id)
            if election is not None and election.phase is not Phase.PROPOSING:
                return
            await self._wait_for(change, max(0.001, deadline - time.monotonic()))

    async def _watch_book(self, look: Callable[[], T | None]) -> T:
        """Look at the election book (``look``) until it finds what the waiter waits for (not
        None), woken by commits between looks (and every 20 ms, to tend open elections). Every
        wait on the book goes through here: it watches commits (``_next_change``) only once it
        is about to wait, and looks again after that. A wait that ends on its first look (the
        usual case for the executor's ``_wait_turn``, and for ``_wait_decided`` once the
        LEAD's commit woke it) leaves the flag unset, so the next commit that nobody needs at
        once (a cell's Completion, which ``_sync_after_cell`` learns of from its own callback)
        does not wake the kernel's loop again (issue 36)."""
        watched = False
        while True:
            change = self._next_change(watch=watched)
            found = look()
            if found is not None:
                return found
            if not watched:  # about to wait: watch commits from now on, then look again
                watched = True
                continue
            self._tend_open_elections()
            await self._wait_for(change, 0.02)
            watched = False

    async def _wait_decided(self, election_id: str) -> Election:
        """Until the election is decided."""

        def look() -> Election | None:
            election = self._election(election_id)
            if election is not None and election.phase is not Phase.PROPOSING:
                return election
            return None

        return await self._watch_book(look)

    async def _wait_settled(self, election_id: str) -> Election:
        """Until the election is settled and its state update applied here."""

        def look() -> Election | None:
            election = self._election(election_id)
            assert election is not None
            with self._apply_lock:
                pending = self._applies_pending
            return election if election.phase.settled and not pending else None

        return await self._watch_book(look)

    # ---- shell handlers ----------------------------------------------------------------------
    def _publish_status(self, status, channel, parent=None) -> None:  # noqa: ANN001
        """No busy/idle for a ``yield_request``: a standby's part in a cell is internal to the
        group, and the scheduler forwards only the executor's IOPub (one busy, one idle)."""
        parent = parent or self.get_parent(channel)
        if (parent or {}).get("header", {}).get("msg_type") == "yield_request":
            return
        super()._publish_status(status, channel, parent)

    async def execute_request(self, stream, ident, parent) -> None:  # noqa: D401
        await self._elected_request(stream, ident, parent, lead=True)

    async def yield_request(self, stream, ident, parent) -> None:
        await self._elected_request(stream, ident, parent, lead=False)

    async def _elected_request(self, stream, ident, parent, lead: bool) -> None:
        try:
            election_id = parent["header"]["msg_id"]
            content = parent["content"]
            code = content["code"]
            silent = bool(content.get("silent", False))
            metadata = parent.get("metadata") or {}
        except (KeyError, TypeError):
            self.log.error("dropping a malformed execute/yield request")
            return
        answered = self._answers.get(election_id)
        if answered is not None:
            fingerprint, reply = answered
            if fingerprint != _fingerprint(parent):
                reply = replies.id_reused(election_id, self.replica_id)
            self.log.info("replica %s: %s came again (its first copy was answered): the same "
                          "reply again, no second run", self.replica_id, election_id)
            self._send_execute_reply(stream, ident, parent, reply)
            return
        with self._waiting_for_group():  # an interrupt targets a running cell, not the group's wait
            await self._wait_until_quiet(election_id)
            if not lead:
                await self._hold_yield(election_id)
            election = self._election(election_id)
            if election is None or (
                election.phase is Phase.PROPOSING and self.replica_id not in election.proposals
            ):
                kind = LEAD if lead and self.gpu.can_lead(metadata) else YIELD
                if kind == LEAD and self._diverged:
                    self.log.warning("replica %s yields %s: its namespace lacks %s", self.replica_id,
                                     election_id, sorted(self._diverged)[:5])
                    kind = YIELD
                self.raft.propose(Proposal(election_id, self.replica_id, kind, silent))
            election = await self._wait_decided(election_id)

        if election.phase is Phase.FAILED:
            reply = replies.all_yielded(election, self.replica_id)
            self._send_execute_reply(stream, ident, parent, reply)
            return
        if (
            election.executor == self.replica_id
            and election.phase is Phase.RUNNING
            and election_id not in self._executed_here
        ):
            self._executed_here.add(election_id)
            with self._waiting_for_group():
                why_not = await self._wait_turn(election)
            if why_not is None:
                await self._execute_as_leader(
                    stream, ident, parent, election, code, silent, metadata
                )
                return
            self.log.error("replica %s elected for %s but cannot run it: %s", self.replica_id,
                           election_id, why_not)
            self.raft.propose(Abort(
                election_id, self.replica_id,
                f"the replica elected to run this cell (replica {self.replica_id}) did not run "
                f"it: {why_not}",
            ))
        with self._waiting_for_group():
            election = await self._wait_settled(election_id)
        self.shell.execution_count = self._book_execution_count() + 1
        if election.phase is Phase.ABORTED:
            reply = replies.executor_failed(election, self.replica_id)
            self._send_execute_reply(stream, ident, parent, reply)
        else:
            self._send_execute_reply(
                stream, ident, parent, replies.standby(election, self.replica_id)
            )

    def _book_execution_count(self) -> int:
        with self.raft.lock:
            return self.raft.book.execution_count

    async def _execute_as_leader(
        self, stream, ident, parent, election: Election, code: str, silent: bool, metadata: dict
    ) -> None:
        if self.cell_container:  # stopped once its checkpoint holds this cell: say it does not
            self.sync.mark_changed()
        try:
            await self._run_cell(stream, ident, parent, election, code, silent, metadata)
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the group must learn it
            self.log.exception("executing %s failed inside the replica", election.election_id)
            failure = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc),
                       "traceback": [], "execution_count": election.execution_count}
            if election.election_id not in self._replied:
                self._send_execute_reply(
                    stream, ident, parent,
                    (failure, replies.role_metadata("executor", self.replica_id, election)),
                )
            if election.election_id in self._synced:
                return  # its Completion was proposed already
            # the cell may have run partly: replicate what it changed so standbys stay equal
            with self._waiting_for_group():
                await self._sync_after_cell(parent, election, code, "error")

    async def _run_cell(
        self, stream, ident, parent, election: Election, code: str, silent: bool, metadata: dict
    ) -> None:
        content = parent["content"]
        count = election.execution_count
        started = utcnow()  # ipykernel's metadata.started: clients compute the run time from it
        if not silent:
            self.shell.execution_count = count
            self._publish_execute_input(code, parent, count)
        self._announce_restore(parent, election)
        self.gpu.bind(self.shell.user_ns, metadata)
        threads_before = self.background.cell_starting()
        try:
            reply = await super().do_execute(
                code,
                silent,
                content.get("store_history", not silent),
                content.get("user_expressions", {}),
                content.get("allow_stdin", False),
                cell_meta=metadata,
                cell_id=metadata.get("cellId"),
            )
        finally:
            self.gpu.unbind(self.shell.user_ns)
            self.background.cell_ended(threads_before)
        if sys.stdout is not None:
            sys.stdout.flush()
        if sys.stderr is not None:
            sys.stderr.flush()
        self.shell.execution_count = count + 1 if not silent else self.shell.execution_count
        reply["execution_count"] = count
        reply_metadata = replies.role_metadata("executor", self.replica_id, election)
        reply_metadata["started"] = started
        if self._restore_report is not None:
            reply_metadata["notebookos"]["restore"] = self._restore_report
            self._restore_report = None
        self._send_execute_reply(stream, ident, parent, (reply, reply_metadata))
        self._replied.add(election.election_id)
        with self._waiting_for_group():  # the group waits for this cell's Completion: never abandon it
            await self._sync_after_cell(parent, election, code, reply.get("status", "ok"))

    def _announce_restore(self, parent, election: Election) -> None:
        """The first cell of a group rebuilt from the store tells the user what survived."""
        with self.raft.lock:
            restored_from = self.raft.book.restored_from
            notes = self.raft.book.restore_notes
        if restored_from is None or election.term != 1:
            return
        woke = self.restored_for == RESTORED_FOR_HIBERNATION
        if woke and restored_from < self.restore_expected:
            notes = [f"the notebook woke from the checkpoint of cell [{restored_from}], but it "
                     f"had run cell [{self.restore_expected}] when it went to sleep: the work "
                     f"of the cells after [{restored_from}] is lost (an older checkpoint "
                     "replaced the newer one: a replica cut off from its group wrote it late)",
                     *notes]
        if self.cell_container or woke:
            if notes:
                text = "".join(f"NotebookOS: {note}\n" for note in notes)
                self.session.send(
                    self.iopub_socket, "stream", {"name": "stderr", "text": text},
                    parent=parent, ident=self._topic("stream"),
                )
            return
        if self.restored_from_survivor:
            text = (
                "NotebookOS: the kernel's Raft group lost its quorum; it was rebuilt from the "
                f"checkpoint of cell [{restored_from}], which holds every cell "
                f"{self.restored_from_survivor}, its most up-to-date survivor, had applied.\n"
            )
        else:
            text = (
                "NotebookOS: every replica of this kernel was lost; the kernel was rebuilt from "
                f"the checkpoint taken after cell [{restored_from}]. Work after that cell is "
                "lost.\n"
            )
        text += "".join(f"NotebookOS: {note}\n" for note in notes)
        self.session.send(
            self.iopub_socket, "stream", {"name": "stderr", "text": text},
            parent=parent, ident=self._topic("stream"),
        )

    async def _sync_after_cell(self, parent, election: Election, code: str, status: str) -> None:
        """Encode what the cell changed, warn about what cannot be synced, propose COMPLETION and
        wait for its commit: ``idle`` then means the cell's state survives the loss of any one
        replica. A full checkpoint follows the commit, off the kernel's loop."""
        self._synced.add(election.election_id)
        update_bytes, warnings = await self.sync.encode_cell(self.shell, code)
        for warning in warnings:
            self.session.send(
                self.iopub_socket,
                "stream",
                {"name": "stderr", "text": f"{warning}\n"},
                parent=parent,
                ident=self._topic("stream"),
            )
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def committed(ok: bool, reason: str) -> None:  # on pysyncobj's thread
            if ok:  # a cell that changed nothing needs no checkpoint soon (the store has its
                # state), one that did a moment later (past the standbys' apply: state_sync.py,
                # CHECKPOINT_AFTER_CHANGE_S), unless this is a per-cell container: it is
                # stopped once its checkpoint covers the cell, so deferring would hold the
                # next cell back
                def on_written(count: int) -> None:
                    self.raft.propose(Checkpointed(count, election.election_id))

                if self.cell_container:
                    self.sync.checkpoint_in_background(election.execution_count, on_written)
                elif update_bytes is not None:
                    self.sync.checkpoint_later(election.execution_count, on_written,
                                               delay_s=CHECKPOINT_AFTER_CHANGE_S)
                else:
                    self.sync.checkpoint_later(election.execution_count, on_written)
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result((ok, reason)))

        self.raft.propose(
            Completion(
                election.election_id, self.replica_id, status, update_bytes, tuple(warnings)
            ),
            on_done=committed,
        )
        ok, reason = await done
        if not ok:
            self.log.error("COMPLETION of %s did not commit: %s", election.election_id, reason)

    def _send_execute_reply(self, stream, ident, parent, reply_and_metadata) -> None:
        content, metadata = reply_and_metadata
        self._answers[parent["header"]["msg_id"]] = (_fingerprint(parent), reply_and_metadata)
        while len(self._answers) > ANSWERS_KEPT:
            self._answers.popitem(last=False)
        self.session.send(
            stream, "execute_reply", content, parent, metadata=metadata, ident=ident
        )
        # On its way now: a ZMQStream only queues a send until its loop's next turn, which for
        # an executor came after the cell's encode and Completion proposal (issue 36: 1.1-1.6
        # ms between this send and the Global Scheduler's receipt of the reply)
        if hasattr(stream, "flush"):
            stream.flush(zmq.POLLOUT)

    # ---- control: membership ---------------------------------------------------------------------
    async def add_replica_request(self, stream, ident, parent) -> None:
        await self._membership_change(stream, ident, parent, add=True)

    async def remove_replica_request(self, stream, ident, parent) -> None:
        await self._membership_change(stream, ident, parent, add=False)

    async def _membership_change(self, stream, ident, parent, add: bool) -> None:
        msg_type = "add_replica_reply" if add else "remove_replica_reply"
        try:
            replica_id = int(parent["content"]["replica_id"])
            address = str(parent["content"].get("raft_address", ""))
            if add and not address:
                raise ValueError("raft_address is required")
        except (KeyError, TypeError, ValueError) as exc:
            self.session.send(
                stream, msg_type, {"status": "error", "ename": "ValueError", "evalue": str(exc),
                                   "traceback": []}, parent, ident=ident,
            )
            return
        if not add:
            with self.raft.lock:
                address = self.raft.book.members.get(replica_id, address)
        ok, reason = await self._change_raft_membership(address, add, replica_id)
        if ok:
            content: dict[str, Any] = {"status": "ok", "replica_id": replica_id}
        else:
            content = {"status": "error", "ename": "NotebookOSMembershipChangeFailed",
                       "evalue": reason, "traceback": []}
        self.session.send(stream, msg_type, content, parent, ident=ident)

    async def _change_raft_membership(self, address: str, add: bool,
                                      replica_id: int) -> tuple[bool, str]:
        """Ask Raft for the change, retrying while the group elects a new Raft leader; answers
        ok only once the change is committed (``_membership_committed``)."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.membership_timeout
        timed_out = "timed out waiting for the membership change to commit"
        ok, reason = False, timed_out
        while time.monotonic() < deadline:
            done = loop.create_future()

            def finished(success: bool, why: str, done=done) -> None:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result((success, why)))

            if add:
                self.raft.add_node(address, finished)
            else:
                self.raft.remove_node(address, finished)
            try:
                ok, reason = await asyncio.wait_for(done, max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                return False, timed_out
            # A retry after LEADER_CHANGED may find the first attempt applied after all, and a
            # leader denies a change its own log already holds (REQUEST_DENIED): applied,
            # perhaps not committed.
            if ok or (address in self.raft.raft_members()) == add:
                committed, why = await self._membership_committed(address, add, replica_id,
                                                                  deadline)
                if committed:
                    return True, reason if ok else "already applied"
                ok, reason = False, why
                if why == timed_out:
                    return ok, reason
            elif reason not in ("LEADER_CHANGED", "MISSING_LEADER", "NOT_LEADER", "DISCARDED",
                                "REQUEST_DENIED"):  # denied: another change is still in flight
                return ok, reason
            await asyncio.sleep(0.2)
        return ok, reason

    async def _membership_committed(self, address: str, add: bool, replica_id: int,
                                    deadline: float) -> tuple[bool, str]:
        """Whether the change is committed: pysyncobj changes a member's view of the group when
        the change is appended to its log, not when it commits, so "already applied" seen from
        a member (or a leader's REQUEST_DENIED) may be a change that a new leader then drops
        (the members roll it back). Answering ok then made the scheduler believe a lost replica
        gone while the group still counted it: with the next replacement the group had four
        members, two of them dead after the next kill, and nothing could commit any more
        (issue 31, items 4 and 8). The book's MemberAdded/MemberRemoved record, proposed after
        the change, commits only with every entry before it in the leader's log; once it has,
        this replica's log holds the leader's up to it, and its view of the group is the
        committed one. (False, why) when the record did not commit in time or the view
        disagrees (the change was rolled back: the caller asks again)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        record = MemberAdded(replica_id, address) if add else MemberRemoved(replica_id)
        self.raft.propose(record, on_done=lambda ok, why: loop.call_soon_threadsafe(
            lambda: done.done() or done.set_result((ok, why))),
            retry_for=max(0.1, deadline - time.monotonic()))
        try:
            committed, why = await asyncio.wait_for(done, max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            return False, "timed out waiting for the membership change to commit"
        if not committed:
            return False, f"the membership change was not committed ({why})"
        if (address in self.raft.raft_members()) != add:
            self.log.warning("the Raft membership change (%s %s) was rolled back by a new "
                             "leader; asking for it again", "add" if add else "remove",
                             address)
            return False, "the membership change was rolled back by a new Raft leader"
        return True, ""

    async def write_checkpoint_request(self, stream, ident, parent) -> None:
        """Write a checkpoint of the state this replica holds, now, and answer with its cell
        number. The Global Scheduler asks the freshest survivor of a group that can no longer
        commit (lost quorum) before rebuilding the group from the store: the rebuilt group then
        starts from every cell the survivor applied, not from the last checkpoint an executor
        managed to write (a SIGKILL right after a cell leaves it behind; found by the notebook
        corpus with a kill after every cell: cells since then came back as NameErrors)."""
        content: dict[str, Any] = {"status": "ok", "replica_id": self.replica_id}
        if parent["content"].get("apply_unconfirmed_tail"):
            # the group lost its quorum: what this replica holds in its log but had not yet
            # learned was committed (the executor's last Completion) belongs to the state
            content["tail_applied"] = await asyncio.to_thread(self.raft.apply_unconfirmed_tail)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            change = self._next_change()  # taken before looking: no change is missed
            if not (self._behind() or self._diverged):
                break
            await self._wait_for(change, deadline - time.monotonic())
        with self.raft.lock:
            count = self.raft.book.execution_count
        if self._diverged or self._behind():
            content.update(status="error", reason="this replica does not hold the committed "
                           "state (" + ("diverged" if self._diverged else "still applying")
                           + ")")
        else:
            try:
                written = await asyncio.to_thread(self.sync.checkpoint_now, count)
            except Exception as exc:  # noqa: BLE001 - the scheduler falls back to the store's
                content.update(status="error", reason=f"{type(exc).__name__}: {exc}")
            else:
                # 0: the store's checkpoint is as recent as this replica's state, or more
                content["checkpoint_count"] = written
                content["execution_count"] = count
                self.log.info("checkpoint of cell %d on request: %s", count,
                              "written" if written else "the store's is as recent")
        self.session.send(stream, "write_checkpoint_reply", content, parent, ident=ident)

    async def replica_status_request(self, stream, ident, parent) -> None:
        background = self.background.running()  # /proc reads: not under Raft's lock
        with self.raft.lock:
            book = self.raft.book
            content = {
                "status": "ok",
                "replica_id": self.replica_id,
                "members": {str(k): v for k, v in book.members.items()},
                "term": book.term,
                "execution_count": book.execution_count,
                "last_executor": book.last_executor,
                # cells elected whose Completion this replica has not applied (running, or
                # committed without its knowing yet)
                "open_elections": len(book.open_elections()),
                "checkpoint_count": book.checkpoint_count,
                # a cell ran here whose effects no written checkpoint holds yet (per-cell
                # containers; a silent cell leaves the counts equal)
                "checkpoint_pending": self.sync.checkpoint_pending(),
                # its checkpoint writes the store refused, holding a newer one (issue 34)
                "checkpoints_refused": self.sync.checkpoints_refused,
                "raft_ready": self._raft_ready.is_set(),
                # what this replica's namespace lacks of the committed state (it never executes
                # while this is non-empty), and whether it is still applying earlier cells
                "diverged": dict(self._diverged),
                "caught_up": not self._behind() and not self._diverged,
                "has_quorum": self.raft.has_quorum(),
                "raft_resting": self.raft.is_resting(),
                # malloc_trim(0) calls as the group came to rest, and the RSS they gave back
                "heap_trims": self.heap_trims,
                "heap_released_bytes": self.heap_released_bytes,
                # commits applied here that woke the kernel's loop (issue 36: only those it uses)
                "commit_wakes": self.commit_wakes,
                "raft_leader": self.raft.leader_address(),
                # pysyncobj's own view of the group (the addresses it counts for a quorum),
                # which can differ from the book's members (issue 32)
                "raft_members": sorted(self.raft.raft_members()),
                # (term, index) of its log's last entry, committed or not: the freshest
                # survivor of a group without quorum is the one Raft would elect
                "raft_log_end": list(self.raft.log_end()),
                "raft_unapplied": self.raft.unapplied_entries(),
                # threads and processes its cells left running (hibernation waits for them)
                "background_work": background,
            }
        self.session.send(stream, "replica_status_reply", content, parent, ident=ident)
