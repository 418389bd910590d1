"""The policy framework: extension points and the strategy objects a policy chooses.

Modelled on the Kubernetes scheduling framework: a scheduling decision goes through a fixed
sequence of small, optional *extension points*, and a policy implements only the points it
needs; the base class (``notebookos.policies.base.Policy``) has a working default for each.

The simulator and the live Global Scheduler run the same *cycle*: ``notebookos.policies.cycle.
run_cycle(snapshot, kernel, request, profile)`` is the one function both call for a cell on a
long-running kernel (``global_scheduler/execution.py``'s ``_try_place``, the simulator's
``session_modes.ReplicatedKernels.try_run``); it returns a ``CycleResult`` whose status is
``SUCCESS`` (with the action: execute, migrate or share), ``UNSCHEDULABLE`` (more capacity would
help), ``UNSCHEDULABLE_AND_UNRESOLVABLE`` (no host could ever run it), ``WAIT`` (it waits for
GPUs on its own hosts or a replica change) or ``ERROR`` (a plug-in failed). Each caller applies
the decision through its own mechanism (commit RPCs / simulated books). Where new containers
start (a kernel's replicas, with the session's GPUs for a policy that binds them at placement; a
per-cell container; a per-cell kernel's first container, which binds no GPUs) both decide
through ``notebookos.policies.container_cycle.run_container_cycle``, with the same status codes
(``SUCCESS`` with ``PLACE`` or ``RESERVE``); the live scheduler also decides there which replica
binds a reservation's session GPUs after a replacement (``Purpose.SESSION_GPUS``; the simulator
models no replica loss).

A *profile* (``notebookos.policies.profile.Profile``) names the plug-in of each point, each found
through an entry-point group and built with its own configuration section:

| extension point | plug-in (profile key; entry-point group) | Policy method / attribute | called when |
|---|---|---|---|
| queue sort | ``queue_sort``; ``notebookos.queue_sort`` (a ``CellOrder``) | job policies: ``priority_key(job, now)`` | a request joins a wait queue (outside the cycle: it says whose turn it is) |
| filter | ``policy``; ``notebookos.policies`` | ``host_acceptable(cluster, host, request)``, ``choose_executor`` | may this host take a new replica/container; which replica's host can run the request now |
| score | ``policy`` | ``candidate_hosts(cluster, request)`` (ordered walk) and ``score(cluster, host, request)`` (optional re-rank of the bounded walk); ``choose_executor`` (the executor first) | which acceptable host / replica is best |
| reserve / unreserve | ``reserve``: ``policy`` (its ``binding``, a ``GpuBindingStrategy``) | ``binding`` | binding and releasing GPUs (per cell, or for the session) |
| post-filter | ``post_filter`` (a list, in order); ``notebookos.post_filter``: ``share`` (TensorShare's sharing), ``migrate`` (``post_filter(cluster, kernel, request)``) | ``post_filter``, ``choose_migration`` | nothing can run the request now: share, migrate, or wait |
| scaling | ``scale``; ``notebookos.scale``: ``policy``, ``ces`` | ``scaling(view)``, ``target_hosts(view)``, ``observe(cluster)`` | every autoscaler interval |
| container lifetime | (the policy) | ``lifetime``: a ``ContainerLifetimeStrategy`` | how long a container lives (the session, or one cell) |

A new plug-in: a class in a package's entry-point group (``notebookos.post_filter``: subclass
``notebookos.policies.cycle.PostFilter``; ``notebookos.queue_sort``: a ``CellOrder``;
``notebookos.policies``: a ``Policy``), named in a profile, its keyword arguments in the
profile's ``config`` section for that point (see ``profile``).

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
