"""How the Global Scheduler runs a kernel, chosen once from the policy's container lifetime.

The policy's ``lifetime`` (``notebookos.policies.framework.ContainerLifetimeStrategy``) picks
one of two mechanisms, and the service calls the chosen ``KernelMode`` instead of testing a
``per_cell`` flag at every step (the simulator does the same: ``simulator/session_modes.py``):

- ``ReplicatedKernels``: long-running replicas placed when the session starts (their GPUs bound
  per cell on the executor, or for the session by a reservation policy: the ``binding``
  strategy), a front that routes every cell to the replicas' election, a lost replica replaced;
- ``CellContainers``: a container per cell (``batch``, ``lcp``: ``cell_containers.py``), the
  kernel parked between cells, a cluster-wide cell queue, a lost container not replaced.

A mode is a thin strategy: the mechanisms stay in the service's mixins (``replicas.py``,
``recovery.py``, ``cell_containers.py``), and each mode says which of them applies.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from notebookos.global_scheduler.cell_front import CellFront
from notebookos.global_scheduler.front import KernelFront

if TYPE_CHECKING:
    from notebookos.global_scheduler.kernels import KernelEntry
    from notebookos.global_scheduler.service import GlobalSchedulerService
    from notebookos.policies.framework import ContainerLifetimeStrategy

log = logging.getLogger(__name__)


class KernelMode(ABC):
    """The part of the Global Scheduler that depends on how long a kernel's containers live."""

    #: A starting kernel's front is bound before its containers run (the client's requests wait
    #: behind it; StartKernel answers once the hosts are chosen).
    starts_behind_front: bool = False
    #: A reservation policy may set the session's GPUs aside when the replicas' hosts are chosen.
    reserves_session_gpus: bool = False
    #: An idle kernel hibernates (hibernation.py): its replicas stop, its checkpoint keeps it.
    hibernates: bool = False

    def __init__(self, service: GlobalSchedulerService) -> None:
        self.service = service

    @abstractmethod
    async def start_containers(self, kernel_id: str) -> None:
        """Start what a new (or restarted) kernel runs before its first cell: a coroutine on
        the loop, whose wait for them to answer holds no thread. Raises StartError."""

    def after_start(self, kernel_id: str) -> None:
        """The kernel is up and its front bound."""
        return None  # nothing by default

    @abstractmethod
    def new_front(self, entry: KernelEntry, ports: dict[str, int] | None,
                  starting: bool) -> KernelFront:
        """The front that clients connect to (on ``ports``, or new ones)."""

    @abstractmethod
    async def place_execute_async(self, kernel_id: str, msg_id: str,
                                  metadata: dict) -> tuple[int, list[int]]:
        """Where the cell ``msg_id`` runs: (replica id, committed GPU ids); may wait. A
        coroutine on the fronts' loop (execution.py)."""

    def cell_released(self, kernel_id: str) -> None:
        """A cell's GPUs were released."""
        return None  # nothing by default

    def queued_cells(self, kernel_id: str) -> int:
        """Cells of the kernel waiting in a queue of the scheduler's own (not in its front)."""
        return 0

    @abstractmethod
    def withdraw_waiting(self, kernel_id: str, front: KernelFront | None) -> int:
        """An interrupt: cells not started yet never run; how many were withdrawn here."""

    @abstractmethod
    def lose_container(self, entry: KernelEntry, replica_id: int, why: str) -> None:
        """A replica or container died or its host was lost. Lock held."""

    @abstractmethod
    def restored(self, entry: KernelEntry) -> None:
        """The kernel came back from the registry after a Global Scheduler restart."""

    def check_configuration(self, policy_name: str, store_url: str) -> None:
        """Warn about a configuration this mode cannot serve well."""
        return None  # nothing by default


class ReplicatedKernels(KernelMode):
    """Long-running replicas placed at session start (``notebookos``, ``reservation``, ...)."""

    starts_behind_front = True
    reserves_session_gpus = True
    hibernates = True

    async def start_containers(self, kernel_id: str) -> None:
        s = self.service
        await s._add_replicas(kernel_id, s.replicas_per_kernel, join=False)

    def new_front(self, entry: KernelEntry, ports: dict[str, int] | None,
                  starting: bool) -> KernelFront:
        s = self.service
        front = KernelFront(entry.kernel_id, entry.key, entry.signature_scheme, s, ip=s.ip,
                            ports=ports, starting=starting,
                            kernel_info=entry.kernel_info or s.kernel_info_seen,
                            bound=None if ports else s.spare_fronts.take())
        front.lazy_link_idle_s = s.idle_links_close_s
        return front

    async def place_execute_async(self, kernel_id: str, msg_id: str,
                                  metadata: dict) -> tuple[int, list[int]]:
        return await self.service._place_on_replicas(kernel_id, msg_id)

    def withdraw_waiting(self, kernel_id: str, front: KernelFront | None) -> int:
        if front is not None:  # cells waiting for GPUs in the front are withdrawn
            front.withdraw_waiting()
        return 0

    def lose_container(self, entry: KernelEntry, replica_id: int, why: str) -> None:
        self.service._lose_and_replace(entry, replica_id, why)

    def restored(self, entry: KernelEntry) -> None:
        s = self.service
        if entry.state == "hibernated":  # it sleeps on; the next cell wakes it
            s._pool.submit(s._finish_pending_stops, entry)
            return
        entry.state = "idle" if len(entry.replicas) >= s.replicas_per_kernel else "degraded"
        if entry.state == "degraded":  # replaced on the loop
            s._restore_replica_count(entry.kernel_id)


class CellContainers(KernelMode):
    """A container per cell (``batch``, ``lcp``): see ``cell_containers.py``."""

    async def start_containers(self, kernel_id: str) -> None:
        await self.service._start_first_container(kernel_id)

    def after_start(self, kernel_id: str) -> None:
        self.service._park(kernel_id)

    def new_front(self, entry: KernelEntry, ports: dict[str, int] | None,
                  starting: bool) -> KernelFront:
        s = self.service
        kernel_id = entry.kernel_id
        front = CellFront(kernel_id, entry.key, entry.signature_scheme, s, ip=s.ip,
                          ports=ports, kernel_info=entry.kernel_info,
                          bound=None if ports else s.spare_fronts.take(),
                          on_interrupt_parked=lambda: s.cancel_waiting_cells(kernel_id))
        front.lazy_link_idle_s = s.idle_links_close_s
        return front

    async def place_execute_async(self, kernel_id: str, msg_id: str,
                                  metadata: dict) -> tuple[int, list[int]]:
        # waits in the cluster-wide cell queue on the loop, holding no thread; only the
        # container start and the commit run on a thread (cell_containers.py)
        return await self.service._place_in_cell_container(kernel_id, msg_id)

    def cell_released(self, kernel_id: str) -> None:
        self.service._cell_released(kernel_id)

    def queued_cells(self, kernel_id: str) -> int:
        return self.service.queued_cells(kernel_id)

    def withdraw_waiting(self, kernel_id: str, front: KernelFront | None) -> int:
        return self.service.cancel_waiting_cells(kernel_id)

    def lose_container(self, entry: KernelEntry, replica_id: int, why: str) -> None:
        self.service._lose_cell_container(entry, replica_id, why)  # not replaced

    def restored(self, entry: KernelEntry) -> None:
        s = self.service
        entry.state = "idle" if entry.replicas else "parked"
        if entry.replicas:  # a cell's container from before the restart: park it
            s._pool.submit(s._park, entry.kernel_id)

    def check_configuration(self, policy_name: str, store_url: str) -> None:
        if not store_url:
            log.warning("policy %s keeps a kernel's state in the store between cells, but no "
                        "store is configured: every cell starts with an empty namespace",
                        policy_name)


def kernel_mode_for(lifetime: ContainerLifetimeStrategy,
                    service: GlobalSchedulerService) -> KernelMode:
    """The mode that implements ``lifetime`` for ``service``."""
    return CellContainers(service) if lifetime.per_cell else ReplicatedKernels(service)

