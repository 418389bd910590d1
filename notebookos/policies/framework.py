"""The policy framework: extension points and the strategy objects a policy chooses.

Modelled on the Kubernetes scheduling framework: a scheduling decision goes through a fixed
sequence of small, optional *extension points*, and a policy implements only the points it
needs; the base class (``notebookos.policies.base.Policy``) has a working default for each.
The simulator and the live Global Scheduler call the same points.

| extension point | Policy method / attribute | called when |
|---|---|---|
| queue ordering | ``priority_key(job, now)`` | a request or job joins a wait queue |
| filter | ``host_acceptable(cluster, host, request)`` | may this host take a new replica/container |
| score | ``candidate_hosts(cluster, request)`` (ordered walk) and ``score(cluster, host, request)`` (optional re-rank of the bounded walk) | which acceptable host is best |
| reserve / unreserve | ``binding``: a ``GpuBindingStrategy`` | binding and releasing GPUs (per cell, or for the session) |
| post-filter | ``post_filter(cluster, kernel, request)`` | nothing can run the request now: migrate, preempt or wait |
| scaling | ``scaling(view)``, ``target_hosts(view)``, ``observe(cluster)`` | every autoscaler interval |
| container lifetime | ``lifetime``: a ``ContainerLifetimeStrategy`` | how long a container lives (the session, or one cell) |

The two modes that used to be branched on in the engines (``per_cell`` containers and
``session`` GPU binding) are the strategy objects below: the engines ask the policy's
``lifetime`` and ``binding`` instead of testing the policy's name or flags.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from notebookos.policies.base import MigrationDecision


class GpuBinding(enum.StrEnum):
    CELL = "cell"  # GPUs committed only while a cell runs
    SESSION = "session"  # GPUs committed when the kernel starts, for its whole life (reservation)


class ContainerLifetime(enum.StrEnum):
    SESSION = "session"  # long-running kernel containers
    CELL = "cell"  # one container per cell task (batch, lcp)


# -- reserve / unreserve ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuBindingStrategy:
    """When a kernel's GPUs are bound (the reserve point) and what that implies for the books.

    ``mode`` is the ``GpuBinding`` it implements. The engines ask:

    - ``binds_at_placement``: commit the kernel's GPUs when its container is placed (reservation)
      rather than when each cell starts;
    - ``placement_needs_free_gpus``: a host must be able to bind the request *now* to take a
      container (true when binding at placement);
    - ``waiting_gpus(request)``: GPUs a kernel that waits for a host asks the autoscaler for;
    - ``standby_gpus(request, replicas)``: GPUs subscribed but not bound while no cell runs
      (billed at the standby rate).
    """

    mode: GpuBinding

    @property
    def binds_at_placement(self) -> bool:
        return self.mode is GpuBinding.SESSION

    @property
    def placement_needs_free_gpus(self) -> bool:
        return self.mode is GpuBinding.SESSION

    def waiting_gpus(self, gpus: int) -> int:
        """GPUs a kernel that found no host waits for (its request when it binds at placement)."""
        return gpus if self.binds_at_placement else 0

    def standby_gpus(self, gpus: int, replicas: int) -> int:
        """GPUs held by replicas that are not executing (none when bound for the session)."""
        return 0 if self.binds_at_placement else gpus * replicas


PER_CELL_BINDING = GpuBindingStrategy(GpuBinding.CELL)
SESSION_BINDING = GpuBindingStrategy(GpuBinding.SESSION)


# -- container lifetime -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerLifetimeStrategy:
    """How long a kernel's container lives.

    - ``SESSION``: long-running replicas placed when the session starts; a migrating policy keeps
      a small prewarm pool per host (``prewarm_pool``) that refills after each use.
    - ``CELL``: a container per cell, placed when the cell is sent, gone when it ends. With
      ``warm_pool`` a host keeps ``warm_per_host`` warm containers that a cell borrows and returns
      (lcp); without, a cell pays a cold start plus ``state_io`` (read state before, write after:
      batch).
    """

    mode: ContainerLifetime
    warm_pool: bool = False
    warm_per_host: int = 0
    state_io: bool = False
    prewarm_pool: bool = False

    @property
    def per_cell(self) -> bool:
        return self.mode is ContainerLifetime.CELL

    @property
    def kernel_at_session_start(self) -> bool:
        """A kernel (its replicas) is placed when the session starts."""
        return self.mode is ContainerLifetime.SESSION

    @property
    def placement_needs_free_gpus(self) -> bool:
        """A per-cell container binds its cell's GPUs when placed."""
        return self.per_cell

    def pool_size(self, prewarm_per_host: int) -> int:
        """Containers kept warm per host: lcp's pool, a migrating policy's prewarm pool, else 0."""
        if self.per_cell:
            return self.warm_per_host if self.warm_pool else 0
        return prewarm_per_host if self.prewarm_pool else 0


SESSION_CONTAINERS = ContainerLifetimeStrategy(ContainerLifetime.SESSION)


def cell_containers(*, warm_per_host: int = 0, state_io: bool = False) -> ContainerLifetimeStrategy:
    """A container per cell; ``warm_per_host`` > 0 keeps a warm pool (lcp)."""
    return ContainerLifetimeStrategy(ContainerLifetime.CELL, warm_pool=warm_per_host > 0,
                                     warm_per_host=warm_per_host, state_io=state_io)


# -- post-filter --------------------------------------------------------------------------------


class PostFilterAction(enum.StrEnum):
    MIGRATE = "migrate"  # move a replica to a host that can bind the request now
    PREEMPT = "preempt"  # stop lower-priority work (job policies that set ``preemptive``)
    WAIT = "wait"  # queue the request until capacity appears (and scale out)


@dataclass(frozen=True, slots=True)
class PostFilterDecision:
    """What to do when no host (no replica's host) can run a request now."""

    action: PostFilterAction
    reason: str
    migration: MigrationDecision | None = None


__all__ = [
    "PER_CELL_BINDING",
    "SESSION_BINDING",
    "SESSION_CONTAINERS",
    "ContainerLifetime",
    "ContainerLifetimeStrategy",
    "GpuBinding",
    "GpuBindingStrategy",
    "PostFilterAction",
    "PostFilterDecision",
    "cell_containers",
]
