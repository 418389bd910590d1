"""The Global Scheduler's queue of cells waiting for GPUs, served in the order of its
``CellOrder`` (``notebookos.policies.cell_order``: arrival, themis, qssf).

Each waiting cell's placement runs on its own front's thread; the queue only says whose turn it
is. A cell may try to bind GPUs when every cell ahead of it in the order has tried since the last
GPU release and could not be placed: the cell at the head gets the GPUs a release frees, and a cell
that wants other hosts waits at most one round of tries for the ones ahead. The queue also tells
the order which cells started and finished, so that it can learn (GPU-time per user, durations
per notebook).

Not thread-safe on its own: every call is made holding the lock of the condition variable the
scheduler waits on (``GlobalSchedulerService._placement_cv``); the callers of ``tried`` and
``leave`` notify it. Waiters are woken by events only (a try, a cell leaving, a GPU release, a
host added, a withdrawal, the scheduler stopping) and by their own deadline: no periodic wake
(``wait_s``).

Whose turn it is is read from the waiters sorted in the order, kept while nothing that could
change the order happens (a cell joining, leaving, starting or finishing, the capacity): one
sort per such event, not one key per waiting cell per look (``_Ordered``). While the release
count stays the same, the cells that may try only grow (a failed try never takes a turn
back), so the queue remembers how far the turns reach and a dispatcher asks only for the cells
whose turn came since it last asked (``new_turns``): a release with N cells waiting costs
O(N) keys in all, not O(N) per waiting cell per try. An order whose keys drift with time
(themis) is sorted again at each look, as each waiter once looked for itself.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from notebookos.policies.cell_order import CellOrder, WaitingCell

MAX_STARTED = 100_000  # cells whose release never came (their kernel vanished): bounded
RECENT_CELLS = 100  # the wait estimate goes by the GPU-holding time of this many latest cells
# An order whose keys drift with time (themis) can change whose turn it is with no event; its
# waiters look again this often. Orders that change only on events (arrival, qssf) never do.
ORDER_RECHECK_S = 1.0


@dataclass(slots=True)
class _Waiter:
    cell: WaitingCell
    failed_at: int = -1  # the release count when its last unsuccessful try began


@dataclass(slots=True)
class _Ordered:
    """The waiters sorted in the order (ties in the order's key share a group: no cell of a
    group is ahead of another), and how far the turns reach for one release count."""

    waiters: list[_Waiter]
    index: dict[tuple[str, str], int]
    group_start: list[int]  # where each position's group of equal keys starts
    group_end: list[int]  # and where it ends
    releases: int = -1  # the release count ``scan`` and ``told`` are for
    scan: int = 0  # the groups before it all tried since ``releases`` and failed
    told: int = 0  # the turns ``new_turns`` reported: positions before it

    @classmethod
    def of(cls, waiters: list[_Waiter], order: CellOrder, now: float) -> _Ordered:
        keyed = sorted(((order.key(w.cell, now), w) for w in waiters), key=lambda kw: kw[0])
        n = len(keyed)
        start, end = [0] * n, [n] * n
        for i in range(1, n):
            start[i] = start[i - 1] if keyed[i][0] == keyed[i - 1][0] else i
        for i in range(n - 2, -1, -1):
            end[i] = end[i + 1] if keyed[i][0] == keyed[i + 1][0] else i + 1
        ordered = [w for _, w in keyed]
        return cls(ordered, {(w.cell.kernel_id, w.cell.msg_id): i for i, w in enumerate(ordered)},
                   start, end)

    def turns_end(self, releases: int) -> int:
        """The positions before it may try at release count ``releases``: every cell ahead of
        each of them (in an earlier group) tried since then and failed."""
        if releases != self.releases:
            self.releases, self.scan, self.told = releases, 0, 0
        n = len(self.waiters)
        while self.scan < n:
            end = self.group_end[self.scan]
            if any(w.failed_at < releases for w in self.waiters[self.scan:end]):
                return end  # this group may try, and none after it
            self.scan = end
        return n


@dataclass(slots=True)
class CellQueue:
    order: CellOrder
    clock: Callable[[], float] = time.monotonic
    _waiters: dict[tuple[str, str], _Waiter] = field(default_factory=dict)
    _started: dict[tuple[str, str], tuple[WaitingCell, float]] = field(default_factory=dict)
    _seq: itertools.count = field(default_factory=itertools.count)
    _recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_CELLS))
    _ordered: _Ordered | None = None  # the waiters in the order, while it holds
    sorts: int = 0  # how often the waiters were sorted (tests count them)

    def _changed(self) -> None:
        """Something that can change the order happened: sort again at the next look."""
        self._ordered = None

    def _in_order(self) -> _Ordered:
        if self._ordered is None or self.order.changes_with_time:
            self.sorts += 1
            self._ordered = _Ordered.of(list(self._waiters.values()), self.order, self.clock())
        return self._ordered

    def _place(self, cell: WaitingCell) -> tuple[_Ordered, int] | None:
        """The sorted waiters and ``cell``'s position among them (None: it does not wait)."""
        waiter = self._waiters.get((cell.kernel_id, cell.msg_id))
        if waiter is None or waiter.cell is not cell:
            return None
        ordered = self._in_order()
        return ordered, ordered.index[(cell.kernel_id, cell.msg_id)]

    def join(self, kernel_id: str, msg_id: str, *, user: str, notebook: str, gpus: int
              ) -> WaitingCell:
        now = self.clock()
        cell = WaitingCell(kernel_id, msg_id, user, notebook, gpus, now, next(self._seq))
        self._waiters[(kernel_id, msg_id)] = _Waiter(cell)
        self.order.cell_waiting(cell, now)
        self._changed()
        return cell

    def set_capacity(self, gpus: int) -> None:
        """The cluster's GPUs now, for the order (a key may depend on them)."""
        self.order.set_capacity(gpus)
        self._changed()

    def _ahead(self, cell: WaitingCell) -> list[_Waiter]:
        now = self.clock()
        mine = self.order.key(cell, now)
        return [w for w in self._waiters.values()
                if w.cell is not cell and self.order.key(w.cell, now) < mine]

    def may_try(self, cell: WaitingCell, releases: int) -> bool:
        """Every cell ahead of ``cell`` tried since release number ``releases`` and failed."""
        placed = self._place(cell)
        if placed is None:  # not waiting (any more): against the waiters, as it is
            return all(w.failed_at >= releases for w in self._ahead(cell))
        ordered, at = placed
        return at < ordered.turns_end(releases)

    def new_turns(self, releases: int) -> list[WaitingCell]:
        """The waiting cells that may try at release count ``releases`` and were not returned
        by the last call (for the same release count, the order unchanged): every one that may
        after a release or a change of the order. A dispatcher resolves just these; a waiter
        that joins later asks ``may_try`` first."""
        ordered = self._in_order()
        end = ordered.turns_end(releases)
        start, ordered.told = ordered.told, max(ordered.told, end)
        return [w.cell for w in ordered.waiters[start:end]]

    def position(self, cell: WaitingCell) -> int:
        """How many waiting cells are ahead of ``cell``."""
        placed = self._place(cell)
        if placed is None:
            return len(self._ahead(cell))
        ordered, at = placed
        return ordered.group_start[at]

    def tried(self, cell: WaitingCell, releases: int, placed: bool) -> None:
        """``cell`` tried (its try began at release number ``releases``)."""
        waiter = self._waiters.get((cell.kernel_id, cell.msg_id))
        if waiter is None:
            return
        if not placed:
            waiter.failed_at = max(waiter.failed_at, releases)
            return
        del self._waiters[(cell.kernel_id, cell.msg_id)]
        self._changed()
        now = self.clock()
        self.order.cell_started(cell, now)
        if len(self._started) >= MAX_STARTED:
            old, _ = self._started.pop(next(iter(self._started)))
            self.order.cell_finished(old, float("nan"), now)
        self._started[(cell.kernel_id, cell.msg_id)] = (cell, now)

    def leave(self, cell: WaitingCell) -> None:
        """``cell`` stops waiting without having run (withdrawn, failed, its kernel stopped)."""
        if self._waiters.pop((cell.kernel_id, cell.msg_id), None) is not None:
            self.order.cell_left(cell, self.clock())
            self._changed()

    def finished(self, kernel_id: str, msg_id: str) -> None:
        """The cell's GPUs were released (or its executor was lost): it ran until now."""
        started = self._started.pop((kernel_id, msg_id), None)
        if started is not None:
            cell, at = started
            now = self.clock()
            self._recent.append(now - at)
            self.order.cell_finished(cell, now - at, now)
            self._changed()

    def kernel_gone(self, kernel_id: str) -> None:
        """The kernel stopped: its running cells end now (not learnt from: cut short)."""
        now = self.clock()
        for key in [k for k in self._started if k[0] == kernel_id]:
            cell, _ = self._started.pop(key)
            self.order.cell_finished(cell, float("nan"), now)
            self._changed()

    def wait_s(self, deadline: float, now: float) -> float:
        """How long a waiter sleeps before it must look again on its own: until its deadline,
        or ``ORDER_RECHECK_S`` when the order changes with time. Every event that can give
        a cell its turn (a try, a cell leaving, a release, a host) wakes it before that."""
        left = max(0.0, deadline - now)
        return min(left, ORDER_RECHECK_S) if self.order.changes_with_time else left

    def waiting(self) -> int:
        return len(self._waiters)

    def estimate_wait_s(self, cell: WaitingCell) -> float | None:
        """A rough wait for ``cell``: the cells running now end one after another, each
        after what is left of the median length of the latest cells, or, once it has run
        longer than that, after as long again as it has run so far (a cell that ran long is
        likely a long one); each cell ahead then takes the first GPUs freed and holds them the
        median length. None before any cell has finished.

        It used to count half a median for every running cell, whatever it had run: behind
        cells that held every GPU for seconds, after short cells, it said "about 0 s"."""
        if not self._recent:
            return None
        typical = statistics.median(self._recent)
        now = self.clock()
        frees = sorted(typical - (now - at) if now - at < typical else now - at
                       for _, at in self._started.values())
        if not frees:
            return typical * self.position(cell)
        for _ in range(self.position(cell)):  # each cell ahead takes the first GPUs freed
            heapq.heapreplace(frees, frees[0] + typical)
        return max(0.0, frees[0])

    def explain(self, cell: WaitingCell) -> str:
        ahead = self.position(cell)
        why = self.order.explain(cell, self.clock())
        where = f"{ahead} cell(s) ahead of it in the queue" if ahead else "first in the queue"
        wait = self.estimate_wait_s(cell)
        if wait is not None:
            where += (f", about {_duration(wait)} to wait (the latest {len(self._recent)} "
                      f"cell(s) held their GPUs {_duration(statistics.median(self._recent))} "
                      "at the median)")
        return f"{where}; {why}" if why else where


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
