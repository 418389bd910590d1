"""The Global Scheduler's side of the shared scheduling cycles (issue 35): the profile they run,
the snapshot the container cycle reads, and the record of every decision applied (for the
decision-equality test). Mixed into ``GlobalSchedulerService``; the mixins that decide
(``execution.py``: a cell on placed replicas; ``replicas.py``: a kernel's replicas;
``cell_containers.py``: a cell's own container and a per-cell kernel's first one;
``recovery.py``: the replica that binds a reservation's session GPUs after a replacement) run
their cycle through it."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from notebookos.cluster import Kernel
from notebookos.policies.container_cycle import Purpose, run_container_cycle
from notebookos.policies.cycle import CycleResult, Snapshot
from notebookos.policies.profile import Profile
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)

# What a recorded decision placed: a cell on a kernel's replicas (``cycle.run_cycle``), a
# kernel's replicas, a cell's own container, a per-cell kernel's first container (no GPUs),
# the replica that binds a reservation's session GPUs anew, a replica moved that no cell asked
# for (``container_cycle.run_container_cycle``).
EXECUTE = "execute"
REPLICAS = "replicas"
CELL_CONTAINER = "cell_container"
FIRST_CONTAINER = "first_container"
SESSION_GPUS = "session_gpus"
MIGRATION = "migration"


@dataclass(frozen=True)
class CycleRecord:
    """One decision the live scheduler took, with the snapshot it was taken on (a copy)."""

    snapshot: Snapshot
    kernel_id: str
    request: ResourceSpec
    result: CycleResult
    kind: str = EXECUTE
    count: int = 1  # containers asked for (REPLICAS, CELL_CONTAINER, FIRST_CONTAINER)


class CycleRunnerMixin:
    cycle_recorder: Callable[[CycleRecord], None] | None = None  # tests: every decision taken

    @property
    def profile(self) -> Profile:
        """The scheduling profile the cycle runs: the daemon's (from the configuration), else
        the policy's own with the service's GPU sharing."""
        explicit = self.__dict__.get("_profile")
        if explicit is not None:
            return explicit
        sharing = getattr(self, "gpu_sharing", None)
        key = (id(self.policy), id(sharing))
        cached = self.__dict__.get("_derived_profile")
        if cached is None or cached[0] != key:
            cached = (key, Profile.for_policy(self.policy, sharing=sharing))
            self.__dict__["_derived_profile"] = cached
        return cached[1]

    @profile.setter
    def profile(self, profile: Profile) -> None:
        self.__dict__["_profile"] = profile
        self.policy = profile.policy
        self.gpu_sharing = profile.sharing

    def _record_cycle(self, snapshot: Snapshot, kernel_id: str, request: ResourceSpec,
                      result: CycleResult, kind: str = EXECUTE, count: int = 1) -> None:
        """Hand a decision about to be applied to ``cycle_recorder`` (tests), with a copy of
        the snapshot it was taken on."""
        log.debug("kernel %s: %s cycle %s %s on %s (%s)", kernel_id, kind, result.status,
                  result.action, result.hosts or result.host_id, result.reason)
        if self.cycle_recorder is not None:
            self.cycle_recorder(CycleRecord(copy.deepcopy(snapshot), kernel_id, request,
                                            result, kind, count))

    def _unavailable_hosts(self) -> frozenset[str]:
        """Hosts that take no new container: draining (host_drain.py), or whose Local
        Scheduler does not answer now (``HostLink.unreachable_since``: killed and not back
        yet, hung): a replica placed there failed to start, and a wake tried it again and again
        (issue 34's fault campaign). Lock held."""
        return frozenset(h for h, link in self.hosts.items()
                         if link.draining or link.unreachable_since)

    def _decide_containers(self, request: ResourceSpec, count: int = 1, *,
                           exclude: Sequence[str] = (), replica_change: str = ""
                           ) -> tuple[Snapshot, CycleResult]:
        """The container cycle on the cluster model, unavailable hosts skipped: where
        ``count`` new containers for ``request`` start. Lock held."""
        snapshot = Snapshot(self.cluster, replica_change=replica_change,
                            unavailable_hosts=self._unavailable_hosts())
        return snapshot, run_container_cycle(snapshot, request, self.profile, count=count,
                                             exclude=exclude)

    def _decide_first_container(self, request: ResourceSpec) -> tuple[Snapshot, CycleResult]:
        """The container cycle for a per-cell kernel's first container (it binds no GPUs and
        only answers kernel_info): its host. Lock held."""
        snapshot = Snapshot(self.cluster, unavailable_hosts=self._unavailable_hosts())
        return snapshot, run_container_cycle(snapshot, request, self.profile,
                                             purpose=Purpose.ANSWER_ONLY)

    def _decide_session_gpus(self, kernel: Kernel, new_ids: Sequence[int],
                             refused: dict[int, str]) -> tuple[Snapshot, CycleResult]:
        """The container cycle for a reservation's session GPUs after the replica holding them
        was replaced: which live replica binds them (``new_ids`` first; ``refused``: replicas
        whose host refused the commit since). Lock held."""
        snapshot = Snapshot(self.cluster, refused=dict(refused), new_replicas=tuple(new_ids))
        return snapshot, run_container_cycle(snapshot, kernel.request, self.profile,
                                             purpose=Purpose.SESSION_GPUS, kernel=kernel)

    def _decide_migration(self, kernel: Kernel, request: ResourceSpec,
                          replica_id: int | None) -> tuple[Snapshot, CycleResult]:
        """The container cycle for a migration no cell asked for (an operator's
        ``MigrateReplica`` naming no target or no replica): which replica moves (``replica_id``
        when named) and where, unavailable hosts skipped. Lock held."""
        snapshot = Snapshot(self.cluster, unavailable_hosts=self._unavailable_hosts())
        return snapshot, run_container_cycle(snapshot, request, self.profile,
                                             purpose=Purpose.MIGRATION, kernel=kernel,
                                             replica_id=replica_id)


__all__ = ["CELL_CONTAINER", "EXECUTE", "FIRST_CONTAINER", "MIGRATION", "REPLICAS",
           "SESSION_GPUS", "CycleRecord", "CycleRunnerMixin"]
