"""One walk of the cell queue's dispatcher over the waiting cells (cell_containers.py): who may
go, and the container cycle's decisions, taken once per kind of cell while the model does not
change.

Within a walk (the lock held) a cell's decision depends only on its request and on whether its
kernel is parked (``_decide_cell_host``), and the cluster model changes only where the walk sets
a cell's GPUs aside (``model_changed``). So a decision is taken once per kind of cell and kept
until then: a walk over N waiting cells of K kinds that places P of them runs at most
K * (P + 1) cycles, not one (or one per cell ahead) per cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from notebookos.global_scheduler.cycle_runner import CELL_CONTAINER
from notebookos.policies.container_cycle import never_fits
from notebookos.policies.cycle import CycleResult, Snapshot
from notebookos.resources import ResourceSpec

if TYPE_CHECKING:
    from notebookos.global_scheduler.cell_containers import CellContainerMixin, CellWaiter

Kind = tuple[ResourceSpec, bool]  # a cell's request, and whether its kernel is parked


@dataclass
class _Decision:
    snapshot: Snapshot
    result: CycleResult
    recorded: bool


class QueueWalk:
    """The state of one walk, in the cell order: the cells still waiting ahead of the one
    looked at, and the decisions taken since the model last changed."""

    def __init__(self, service: CellContainerMixin) -> None:
        self._service = service
        self._backfill = bool(service.policy.backfill)
        self.ahead = 0  # cells still waiting ahead of the one looked at
        self._ahead_kinds: dict[Kind, CellWaiter] = {}  # one cell of each kind ahead
        self._decided: dict[Kind, _Decision] = {}
        self._never: dict[ResourceSpec, str] = {}

    def _kind(self, waiter: CellWaiter) -> Kind:
        return waiter.request, self._service._parked(waiter)

    def never_fits(self, request: ResourceSpec) -> str:
        """Why no host could ever hold ``request`` ("" when one could)."""
        if request not in self._never:
            self._never[request] = never_fits(self._service.cluster, request,
                                              "this cell's request")
        return self._never[request]

    def _decision(self, kind: Kind, waiter: CellWaiter) -> _Decision:
        decision = self._decided.get(kind)
        if decision is None:
            snapshot, result = self._service._decide_cell_host(waiter)
            decision = self._decided[kind] = _Decision(snapshot, result, recorded=False)
        return decision

    def may_go(self, waiter: CellWaiter) -> bool:
        """Without backfill (batch) only the first cell still waiting may take a host; with
        backfill (lcp) a cell may when no cell still waiting ahead of it could take one now."""
        if not self.ahead:
            return True
        if not self._backfill:
            return False
        return not any(self._decision(kind, other).result.placed
                       for kind, other in self._ahead_kinds.items())

    def decide(self, waiter: CellWaiter) -> CycleResult:
        """The container cycle for ``waiter``'s container, recorded (``_record_cycle``) once
        per decision taken."""
        decision = self._decision(self._kind(waiter), waiter)
        if not decision.recorded:
            decision.recorded = True
            self._service._record_cycle(decision.snapshot, waiter.kernel_id, waiter.request,
                                        decision.result, CELL_CONTAINER)
        return decision.result

    def model_changed(self) -> None:
        """A cell's GPUs were set aside: the decisions taken are out of date."""
        self._decided.clear()

    def still_waiting(self, waiter: CellWaiter) -> None:
        """``waiter`` waits on: it is ahead of the cells the walk looks at next."""
        self.ahead += 1
        self._ahead_kinds.setdefault(self._kind(waiter), waiter)


__all__ = ["QueueWalk"]
