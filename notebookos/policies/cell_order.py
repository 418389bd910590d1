"""The order in which cells waiting for GPUs are served (the queue-ordering extension point of the
live Global Scheduler, ``global_scheduler.cell_order``), combined with any session policy.

When GPUs are released and several cells wait for them, the cell whose ``key`` is smallest tries
first; a cell further back tries only once every cell ahead of it has tried since that release
and could not be placed (so a cell that wants other hosts is never held up for long). Pure, as
every policy (DESIGN section 2): the caller passes the time and reports the events.

- ``arrival``: first come, first served (the default; what the scheduler always did).
- ``themis``: finish-time fairness between *users* (Themis, seed 004, with the user as the app).
  A user's rho = T_shared / T_independent over a decaying window: T_shared is the wall time during
  which the user had a cell waiting or running; T_independent is the GPU-time the user's cells
  used divided by the user's fair share, min(cluster GPUs / N_avg, the user's demand), N_avg the
  time-weighted number of users with cells waiting or running (while any has). The waiting cell of the user with
  the largest rho goes first, so a user with many notebooks cannot starve one with a single
  notebook. A lease is one cell: GPUs are bound per cell, so leases are as short as cells and a
  running cell is never preempted.
- ``qssf``: quasi-shortest-service-first (Helios, seed 002): smallest predicted GPU-time first,
  the prediction learnt from the cluster's own history of cell durations: an exponentially
  weighted mean per (user, notebook), falling back to the user's, then everyone's.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class WaitingCell:
    """A cell as the queue order sees it."""

    kernel_id: str
    msg_id: str
    user: str
    notebook: str
    gpus: int
    arrived: float  # when it joined the queue (the caller's clock)
    seq: int  # arrival order, the final tie-breaker


class CellOrder(ABC):
    """Orders waiting cells; learns from the cells that ran."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # Whether ``key`` changes as time passes with no event (fairness decays): then a cell
    # waiting for its turn looks at the order again now and then, not only on an event.
    changes_with_time: ClassVar[bool] = False

    @abstractmethod
    def key(self, cell: WaitingCell, now: float) -> tuple:
        """Smaller goes first."""

    def cell_waiting(self, cell: WaitingCell, now: float) -> None:  # noqa: B027 - optional hook
        """``cell`` joined the queue."""

    def cell_left(self, cell: WaitingCell, now: float) -> None:  # noqa: B027 - optional hook
        """``cell`` left the queue without running (withdrawn, failed)."""

    def cell_started(self, cell: WaitingCell, now: float) -> None:  # noqa: B027 - optional hook
        """``cell``'s GPUs were bound."""

    def cell_finished(self, cell: WaitingCell, ran_s: float, now: float  # noqa: B027
                      ) -> None:
        """``cell``'s GPUs were released after ``ran_s`` seconds."""

    def set_capacity(self, gpus: int) -> None:  # noqa: B027 - optional hook
        """The cluster's GPUs now (hosts come and go)."""

    def explain(self, cell: WaitingCell, now: float) -> str:
        """Why ``cell`` sits where it does, for the message the user sees while it waits."""
        return ""

    def report(self) -> dict[str, Any]:
        return {}


class ArrivalOrder(CellOrder):
    name: ClassVar[str] = "arrival"
    description: ClassVar[str] = "first come, first served"

    def key(self, cell: WaitingCell, now: float) -> tuple:
        return (cell.arrived, cell.seq)


@dataclass(slots=True)
class _UserLedger:
    pending_s: float = 0.0  # decayed wall time with a cell waiting or running
    busy_gpu_s: float = 0.0  # decayed GPU-seconds used
    active: int = 0  # cells waiting or running now
    demand: int = 0  # GPUs of those cells


class UserFairness(CellOrder):
    """Themis's finish-time fairness with users as apps (see the module's docstring)."""

    name: ClassVar[str] = "themis"
    description: ClassVar[str] = "finish-time fairness between users (Themis)"
    changes_with_time: ClassVar[bool] = True

    def __init__(self, *, half_life_s: float = 600.0, capacity_gpus: int = 1) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s={half_life_s} must be > 0")
        self.half_life_s = float(half_life_s)
        self.capacity_gpus = max(1, int(capacity_gpus))
        self._users: dict[str, _UserLedger] = {}
        self._running: dict[tuple[str, str], int] = {}  # cell -> GPUs while running
        self._user_s = 0.0  # decayed integral of the number of active users
        self._time_s = 0.0  # decayed integral of time
        self._last: float | None = None

    def _advance(self, now: float) -> None:
        if self._last is None or now <= self._last:
            self._last = now if self._last is None else self._last
            return
        dt = now - self._last
        decay = 0.5 ** (dt / self.half_life_s)
        active_users = 0
        for ledger in self._users.values():
            ledger.pending_s *= decay
            ledger.busy_gpu_s *= decay
            if ledger.active:
                active_users += 1
                ledger.pending_s += dt
        for key, gpus in self._running.items():
            ledger = self._users.get(key[0])
            if ledger is not None:
                ledger.busy_gpu_s += gpus * dt
        for user in [u for u, ledger in self._users.items() if self._forgotten(ledger)]:
            del self._users[user]  # its history has decayed away
        # N_avg averages over the time some user had cells queued or running: idle time would
        # drag it towards 0 (then every user's fair share is the whole cluster).
        self._user_s = self._user_s * decay + active_users * dt
        self._time_s = self._time_s * decay + (dt if active_users else 0.0)
        self._last = now

    @staticmethod
    def _forgotten(ledger: _UserLedger) -> bool:
        return not ledger.active and ledger.pending_s < 1e-3 and ledger.busy_gpu_s < 1e-3

    def _ledger(self, user: str) -> _UserLedger:
        return self._users.setdefault(user, _UserLedger())

    def n_avg(self) -> float:
        return max(1.0, self._user_s / self._time_s) if self._time_s > 0 else 1.0

    def rho(self, user: str, now: float) -> float:
        """The user's finish-time fairness now (inf: waiting and never served)."""
        self._advance(now)
        ledger = self._users.get(user)
        if ledger is None or ledger.busy_gpu_s <= 1e-9:
            return math.inf
        share = min(self.capacity_gpus / self.n_avg(), max(1, ledger.demand))
        return ledger.pending_s * share / ledger.busy_gpu_s

    def key(self, cell: WaitingCell, now: float) -> tuple:
        return (-self.rho(cell.user, now), cell.arrived, cell.seq)

    def cell_waiting(self, cell: WaitingCell, now: float) -> None:
        self._advance(now)
        ledger = self._ledger(cell.user)
        ledger.active += 1
        ledger.demand += cell.gpus

    def _leave(self, cell: WaitingCell) -> None:
        ledger = self._ledger(cell.user)
        ledger.active = max(0, ledger.active - 1)
        ledger.demand = max(0, ledger.demand - cell.gpus)

    def cell_left(self, cell: WaitingCell, now: float) -> None:
        self._advance(now)
        self._leave(cell)

    def cell_started(self, cell: WaitingCell, now: float) -> None:
        self._advance(now)
        self._running[(cell.user, f"{cell.kernel_id}/{cell.msg_id}")] = cell.gpus

    def cell_finished(self, cell: WaitingCell, ran_s: float, now: float) -> None:
        self._advance(now)
        self._running.pop((cell.user, f"{cell.kernel_id}/{cell.msg_id}"), None)
        self._leave(cell)

    def set_capacity(self, gpus: int) -> None:
        self.capacity_gpus = max(1, int(gpus))

    def explain(self, cell: WaitingCell, now: float) -> str:
        rho = self.rho(cell.user, now)
        shown = "not served yet" if math.isinf(rho) else f"{rho:.2f}"
        return (f"cells are served by finish-time fairness between users (themis); user "
                f"{cell.user or '(unknown)'}: {shown}, larger goes first")

    def report(self) -> dict[str, Any]:
        now = self._last or 0.0
        return {"n_avg": round(self.n_avg(), 2),
                "rho": {u: (None if math.isinf(r) else round(r, 3))
                        for u in list(self._users) for r in [self.rho(u, now)]}}


class PredictedShortestFirst(CellOrder):
    """QSSF over the cluster's history of cell durations (see the module's docstring)."""

    name: ClassVar[str] = "qssf"
    description: ClassVar[str] = "smallest predicted GPU-time first (Helios QSSF)"

    def __init__(self, *, alpha: float = 0.3, default_s: float = 60.0,
                 max_notebooks: int = 10_000) -> None:
        if not 0.0 < alpha <= 1.0 or default_s <= 0:
            raise ValueError("alpha must be in (0, 1] and default_s > 0")
        self.alpha = float(alpha)
        self.default_s = float(default_s)
        self.max_notebooks = int(max_notebooks)
        self._by_notebook: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._by_user: dict[str, float] = {}
        self._overall: float | None = None
        self._running: dict[tuple[str, str], WaitingCell] = {}
        self.learned = 0

    def predict_s(self, user: str, notebook: str) -> float:
        for value in (self._by_notebook.get((user, notebook)), self._by_user.get(user),
                      self._overall):
            if value is not None:
                return value
        return self.default_s

    def key(self, cell: WaitingCell, now: float) -> tuple:
        return (max(1, cell.gpus) * self.predict_s(cell.user, cell.notebook), cell.arrived,
                cell.seq)

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.alpha) * old + self.alpha * new

    def cell_finished(self, cell: WaitingCell, ran_s: float, now: float) -> None:
        if ran_s < 0 or not math.isfinite(ran_s):
            return
        key = (cell.user, cell.notebook)
        self._by_notebook[key] = self._blend(self._by_notebook.get(key), ran_s)
        self._by_notebook.move_to_end(key)
        while len(self._by_notebook) > self.max_notebooks:
            self._by_notebook.popitem(last=False)
        self._by_user[cell.user] = self._blend(self._by_user.get(cell.user), ran_s)
        self._overall = self._blend(self._overall, ran_s)
        self.learned += 1

    def explain(self, cell: WaitingCell, now: float) -> str:
        return (f"cells are served shortest predicted first (qssf); this notebook's cells are "
                f"predicted to take {self.predict_s(cell.user, cell.notebook):.1f}s")

    def report(self) -> dict[str, Any]:
        return {"cells_learned": self.learned, "notebooks": len(self._by_notebook)}


CELL_ORDERS: dict[str, type[CellOrder]] = {
    cls.name: cls for cls in (ArrivalOrder, UserFairness, PredictedShortestFirst)}


def cell_order_for(name: str, **params: Any) -> CellOrder:
    """The cell order called ``name``; a clear error for an unknown one or bad parameters."""
    cls = CELL_ORDERS.get(name)
    if cls is None:
        raise ValueError(f"unknown cell order {name!r}; choose one of "
                         f"{', '.join(CELL_ORDERS)}")
    return cls(**params)
