"""The scheduling cycle for new containers: where a kernel's replicas start (with the session's
GPUs, for a policy that binds them at placement: ``reservation``) and where a cell's own
container starts (``batch``, ``lcp``: a container per cell). Issue 35: the live Global Scheduler
(``global_scheduler/replicas.py``, ``cell_containers.py``) and the simulator
(``simulator/sessionsim.py``, ``session_modes.CellContainers``) both take these decisions here,
as they take a cell's decision on placed replicas through ``cycle.run_cycle``.

``run_container_cycle(snapshot, request, profile, count=..., exclude=..., purpose=...)`` runs
the profile's filter and score for one of three purposes (``Purpose``):

- ``CONTAINERS`` (the default): where ``count`` new containers that may bind the request's GPUs
  start (a kernel's replicas, a cell's own container): the policy's ``acceptable_hosts``
  (``candidate_hosts``, ``host_acceptable``, ``score``);
- ``ANSWER_ONLY``: the first container of a per-cell kernel, which binds no GPUs and only
  answers ``kernel_info`` before the kernel is parked: a host the policy accepts for the
  request, else any host that can hold its subscription, the most idle first (at most the
  policy's ``candidate_limit``);
- ``SESSION_GPUS``: which of ``kernel``'s live replicas binds the session's GPUs after the one
  that held them was replaced (reservation): the replicas just started first
  (``Snapshot.new_replicas``), then the others by id; the first whose host can commit the
  request now and did not refuse it (``Snapshot.refused``). No container starts.
- ``MIGRATION``: which of ``kernel``'s replicas moves (``replica_id`` when the caller names it)
  and to which host, for a migration no cell asked for (an operator's ``MigrateReplica`` that
  names no target or no replica): the policy's ``choose_migration``, never to a host of
  ``Snapshot.unavailable_hosts``. One container starts, on ``host_id``.

It returns a ``CycleResult``:

| status | action | meaning |
|---|---|---|
| ``SUCCESS`` | ``PLACE`` | start the containers on ``hosts`` (``host_id``: the first) |
| ``SUCCESS`` | ``MIGRATE`` | ``MIGRATION``: move ``replica_id`` to ``host_id`` (``migration``: the policy's decision) |
| ``SUCCESS`` | ``RESERVE`` | the same, and bind the session's GPUs on ``host_id`` (the policy's ``binding`` binds at placement, its containers live for the session); ``SESSION_GPUS``: bind them to ``replica_id`` on ``host_id`` (``order``: the replicas walked) |
| ``UNSCHEDULABLE`` | | fewer than ``count`` hosts can take one now (``hosts``: those that can); more capacity would help |
| ``UNSCHEDULABLE_AND_UNRESOLVABLE`` | | no host of the cluster (``SESSION_GPUS``: of the kernel's replicas) could ever hold the request (``never_fits``); ``MIGRATION``: the policy does not migrate, or the kernel has one replica |
| ``WAIT`` | | the kernel's containers are changing (``Snapshot.replica_change``: a per-cell kernel's last container is still parking); ``SESSION_GPUS``: no replica's host can commit the session's GPUs now (a policy that binds at placement does not migrate: cells bind per cell until one can), or the kernel has no live replica |
| ``ERROR`` | | a plug-in failed |

The cycle is pure; the caller applies the decision (start the containers, set the GPUs aside
or commit them) through its own mechanism.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from notebookos.cluster import Cluster, Kernel
from notebookos.policies import placement
from notebookos.policies.cycle import (
    NO_REPLICA,
    ONE_REPLICA_STAYS,
    Action,
    CycleResult,
    Snapshot,
    Status,
    first_committable,
)
from notebookos.resources import ResourceSpec

if TYPE_CHECKING:
    from notebookos.policies.profile import Profile

log = logging.getLogger(__name__)


class Purpose(enum.StrEnum):
    """What a container cycle decides (see the module's docstring)."""

    CONTAINERS = "containers"  # new containers that may bind the request's GPUs
    ANSWER_ONLY = "answer_only"  # a per-cell kernel's first container: no GPUs, kernel_info
    SESSION_GPUS = "session_gpus"  # the live replica that binds the session's GPUs anew
    MIGRATION = "migration"  # a replica moved that no cell asked for (an operator's)


def never_fits(cluster: Cluster, request: ResourceSpec, what: str = "this request") -> str:
    """Why no host of ``cluster`` could ever hold ``request`` ("" when one could, or when no
    host is registered yet: one may join)."""
    hosts = list(cluster.hosts.values())
    if not hosts or any(request.fits_within(h.capacity) for h in hosts):
        return ""
    return (f"no host can ever bind {what} ({request}): {len(hosts)} host(s) registered, "
            "none that large")


def placement_action(profile: Profile) -> Action:
    """``RESERVE`` for a policy whose long-running containers get the session's GPUs when
    placed (reservation), else ``PLACE``."""
    policy = profile.policy
    if policy.binding.binds_at_placement and not policy.lifetime.per_cell:
        return Action.RESERVE
    return Action.PLACE


def run_container_cycle(snapshot: Snapshot, request: ResourceSpec, profile: Profile, *,
                        count: int = 1, exclude: Sequence[str] = (),
                        purpose: Purpose = Purpose.CONTAINERS,
                        kernel: Kernel | None = None,
                        replica_id: int | None = None) -> CycleResult:
    """Where ``count`` new containers for ``request`` start (distinct hosts, none of
    ``exclude`` or ``snapshot.unavailable_hosts``), the host of a per-cell kernel's first
    container (``ANSWER_ONLY``), or which of ``kernel``'s replicas binds the session's GPUs
    (``SESSION_GPUS``), or which replica of ``kernel`` moves where (``MIGRATION``; ``replica_id``:
    the one the caller names): see the module's docstring."""
    try:
        if purpose is Purpose.MIGRATION:
            return _migration_cycle(snapshot, kernel, request, profile, replica_id)
        if purpose is Purpose.SESSION_GPUS:
            return _session_gpus_cycle(snapshot, kernel, request)
        return _container_cycle(snapshot, request, profile, count, exclude,
                                purpose is Purpose.ANSWER_ONLY)
    except Exception as exc:  # noqa: BLE001 - a plug-in's failure is the request's error
        log.exception("container placement cycle failed")
        return CycleResult(Status.ERROR, f"the scheduling cycle failed: "
                           f"{type(exc).__name__}: {exc}")


def _container_cycle(snapshot: Snapshot, request: ResourceSpec, profile: Profile, count: int,
                     exclude: Sequence[str], answer_only: bool) -> CycleResult:
    if snapshot.replica_change:
        return CycleResult(Status.WAIT, snapshot.replica_change)
    cluster = snapshot.cluster
    skip = [*exclude, *sorted(snapshot.unavailable_hosts)]
    found = tuple(h.host_id for h in profile.policy.acceptable_hosts(cluster, request, count,
                                                                     skip))
    if answer_only and not found:
        # it binds no GPUs: any host that can hold its subscription, the most idle first
        found = tuple(h.host_id for h in placement.most_idle_first(
            cluster, min_idle=0, limit=profile.policy.candidate_limit)
            if h.host_id not in skip and h.can_subscribe(request))[:count]
    if len(found) == count:
        action = Action.PLACE if answer_only else placement_action(profile)
        return CycleResult(Status.SUCCESS, "", action, host_id=found[0], hosts=found)
    unresolvable = never_fits(cluster, request)
    if unresolvable:
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE, unresolvable, hosts=found)
    return CycleResult(Status.UNSCHEDULABLE,
                       f"{len(found)} of the {count} host(s) needed can take a container for "
                       f"the request ({request}) now"
                       + (", even one that binds no GPUs" if answer_only else ""), hosts=found)


def _migration_cycle(snapshot: Snapshot, kernel: Kernel | None, request: ResourceSpec,
                     profile: Profile, replica_id: int | None) -> CycleResult:
    if kernel is None:
        return CycleResult(Status.ERROR, "the kernel is not in the cluster model")
    policy = profile.policy
    if not policy.supports_migration:
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE,
                           f"policy {policy.name} does not migrate replicas")
    live = kernel.live_replicas()
    if len(live) < 2:
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE, ONE_REPLICA_STAYS)
    if replica_id is not None and replica_id not in {r.replica_id for r in live}:
        return CycleResult(Status.ERROR, f"kernel {kernel.kernel_id} has no live replica "
                           f"{replica_id}")
    if snapshot.replica_change:
        return CycleResult(Status.WAIT, snapshot.replica_change)
    migration = policy.choose_migration(snapshot.cluster, kernel, request,
                                        snapshot.unavailable_hosts)
    if migration is None:
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE,
                           f"policy {policy.name} does not migrate replicas")
    target = migration.target_host_id
    if target is None:
        unresolvable = never_fits(snapshot.cluster, request, "a replica of the kernel")
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable
                           else Status.UNSCHEDULABLE,
                           unresolvable or f"no host can take a replica of kernel "
                           f"{kernel.kernel_id} now: {migration.reason}", migration=migration)
    moving = migration.replica_id if replica_id is None else replica_id
    return CycleResult(Status.SUCCESS, migration.reason, Action.MIGRATE, moving, target,
                       migration=migration, hosts=(target,))


def _session_gpus_cycle(snapshot: Snapshot, kernel: Kernel | None,
                        request: ResourceSpec) -> CycleResult:
    if kernel is None:
        return CycleResult(Status.ERROR, "the kernel is not in the cluster model")
    cluster = snapshot.cluster
    live = {r.replica_id: r for r in kernel.live_replicas()}
    if not live:
        return CycleResult(Status.WAIT, NO_REPLICA)
    first = [rid for rid in snapshot.new_replicas if rid in live]
    order = tuple(first + sorted(set(live) - set(first)))
    reasons: list[str] = []
    rid, host_id = first_committable(snapshot, kernel, order, request, reasons)
    if rid is not None:
        return CycleResult(Status.SUCCESS, "", Action.RESERVE, rid, host_id, order,
                           hosts=(host_id,))
    capacities = [cluster.hosts[r.host_id].capacity.gpus for r in live.values()
                  if r.host_id in cluster.hosts]
    if capacities and request.gpus > max(capacities):
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE,
                           f"the session asks for {request.gpus} GPU(s) and no host of its "
                           f"replicas has more than {max(capacities)}", order=order)
    return CycleResult(Status.WAIT, f"no replica's host can bind the session's {request.gpus} "
                       f"GPU(s) now ({'; '.join(reasons)}); cells bind them per cell until one "
                       "can", order=order)


__all__ = ["Purpose", "never_fits", "placement_action", "run_container_cycle"]
