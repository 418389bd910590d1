"""The scheduling cycle for new containers: where a kernel's replicas start (with the session's
GPUs, for a policy that binds them at placement: ``reservation``) and where a cell's own
container starts (``batch``, ``lcp``: a container per cell). Issue 35: the live Global Scheduler
(``global_scheduler/replicas.py``, ``cell_containers.py``) and the simulator
(``simulator/sessionsim.py``, ``session_modes.CellContainers``) both take these decisions here,
as they take a cell's decision on placed replicas through ``cycle.run_cycle``.

``run_container_cycle(snapshot, request, profile, count=..., exclude=...)`` runs the profile's
filter and score (the policy's ``acceptable_hosts``: ``candidate_hosts``, ``host_acceptable``,
``score``) and returns a ``CycleResult``:

| status | action | meaning |
|---|---|---|
| ``SUCCESS`` | ``PLACE`` | start the containers on ``hosts`` (``host_id``: the first) |
| ``SUCCESS`` | ``RESERVE`` | the same, and bind the session's GPUs on ``host_id`` (the policy's ``binding`` binds at placement, its containers live for the session) |
| ``UNSCHEDULABLE`` | | fewer than ``count`` hosts can take one now (``hosts``: those that can); more capacity would help |
| ``UNSCHEDULABLE_AND_UNRESOLVABLE`` | | no host of the cluster could ever hold the request (``never_fits``) |
| ``WAIT`` | | the kernel's containers are changing (``Snapshot.replica_change``: a per-cell kernel's last container is still parking) |
| ``ERROR`` | | a plug-in failed |

The cycle is pure; the caller applies the decision (start the containers, set the GPUs aside
or commit them) through its own mechanism.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from notebookos.cluster import Cluster
from notebookos.policies.cycle import Action, CycleResult, Snapshot, Status
from notebookos.resources import ResourceSpec

if TYPE_CHECKING:
    from notebookos.policies.profile import Profile

log = logging.getLogger(__name__)


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
                        count: int = 1, exclude: Sequence[str] = ()) -> CycleResult:
    """Where ``count`` new containers for ``request`` start (distinct hosts, none of
    ``exclude`` or ``snapshot.unavailable_hosts``): see the module's docstring."""
    try:
        return _container_cycle(snapshot, request, profile, count, exclude)
    except Exception as exc:  # noqa: BLE001 - a plug-in's failure is the request's error
        log.exception("container placement cycle failed")
        return CycleResult(Status.ERROR, f"the scheduling cycle failed: "
                           f"{type(exc).__name__}: {exc}")


def _container_cycle(snapshot: Snapshot, request: ResourceSpec, profile: Profile, count: int,
                     exclude: Sequence[str]) -> CycleResult:
    if snapshot.replica_change:
        return CycleResult(Status.WAIT, snapshot.replica_change)
    cluster = snapshot.cluster
    skip = [*exclude, *sorted(snapshot.unavailable_hosts)]
    found = tuple(h.host_id for h in profile.policy.acceptable_hosts(cluster, request, count,
                                                                     skip))
    if len(found) == count:
        return CycleResult(Status.SUCCESS, "", placement_action(profile), host_id=found[0],
                           hosts=found)
    unresolvable = never_fits(cluster, request)
    if unresolvable:
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE, unresolvable, hosts=found)
    return CycleResult(Status.UNSCHEDULABLE,
                       f"{len(found)} of the {count} host(s) needed can take a container for "
                       f"the request ({request}) now", hosts=found)


__all__ = ["never_fits", "placement_action", "run_container_cycle"]
