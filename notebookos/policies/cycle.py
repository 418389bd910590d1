"""One scheduling cycle: the decision the live Global Scheduler and the simulator both take for a
request on a kernel whose replicas are placed (issue 35).

``run_cycle(snapshot, kernel, request, profile)`` runs the extension points of
``notebookos.policies.framework`` in order and returns a ``CycleResult`` with a status code, as
the Kubernetes scheduling framework does:

1. queue sort happens outside (the caller's wait queue orders requests with the profile's
   ``queue_sort`` plug-in; the cycle is run for the request whose turn it is);
2. filter and score: the profile's policy chooses the executor (``choose_executor``); the other
   live replicas follow, the most idle host first. The first whose host can commit the request
   now (and that the caller has not seen refused: ``Snapshot.refused``) is the decision;
3. post-filter, when nothing fits: the profile's post-filter plug-ins in order (``share``: join
   a GPU another kernel's cell holds, when the sharing decision accepts the pair; ``migrate``:
   the policy's ``post_filter``: move a replica to a host that can bind the request now, or
   wait).

Where new containers start (a kernel's replicas, a per-cell container) is the same kind of
decision on the same snapshot: ``container_cycle.run_container_cycle``.

The cycle is pure: it reads the snapshot (the cluster model and what the caller knows beyond
it) and returns a decision; the caller applies it (commit, share, migrate, wait) through its own
mechanism. Status codes:

| status | meaning | the caller |
|---|---|---|
| ``SUCCESS`` | run now: ``action`` says how (``EXECUTE`` on ``replica_id`` at ``host_id``, ``MIGRATE`` that replica to ``host_id`` first, ``SHARE`` a device there) | applies it |
| ``UNSCHEDULABLE`` | nothing can run it now and more capacity would help (no host can take a migrating replica) | asks for capacity, waits, tries again |
| ``UNSCHEDULABLE_AND_UNRESOLVABLE`` | no host of this cluster could ever run it (it asks for more GPUs than any host has) | fails it (live) / keeps it waiting (simulator: the trace's problem) |
| ``WAIT`` | it waits for something under way, not for capacity: GPUs on its own replicas' hosts (the policy does not migrate, or the kernel has one replica), a replica change | waits, tries again on a release |
| ``ERROR`` | a plug-in failed, or the snapshot is inconsistent | fails the request with the reason |
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from notebookos.cluster import Cluster, Kernel
from notebookos.policies.base import MigrationDecision, Policy
from notebookos.policies.framework import PostFilterAction
from notebookos.policies.gpu_sharing import GpuSharing, SharingParty
from notebookos.resources import ResourceSpec

if TYPE_CHECKING:
    from notebookos.policies.profile import Profile

log = logging.getLogger(__name__)

ONE_REPLICA_STAYS = ("a kernel of one replica cannot migrate: a new replica joins the others "
                     "and takes their state, and it has no other (cluster.replicas_per_kernel)")
NO_REPLICA = "the kernel has no replica to run the cell (replacements are starting)"


class Status(enum.StrEnum):
    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"
    UNSCHEDULABLE_AND_UNRESOLVABLE = "unschedulable_and_unresolvable"
    WAIT = "wait"
    ERROR = "error"


class Action(enum.StrEnum):
    EXECUTE = "execute"  # commit on the replica's host
    MIGRATE = "migrate"  # move the replica to ``host_id``, then commit there
    SHARE = "share"  # join devices another kernel's cell holds on the replica's host
    PLACE = "place"  # start new containers on ``hosts`` (a kernel's replicas, a cell's container)
    RESERVE = "reserve"  # PLACE, and bind the session's GPUs on ``host_id`` (reservation)
    NONE = "none"  # nothing to apply (every status but SUCCESS)


@dataclass(frozen=True, slots=True)
class ReplicaDevices:
    """What a replica's host's devices hold, for the share post-filter (device id -> the
    parties holding it, first holder first; device id -> its GPU memory in GB)."""

    host_id: str
    devices: Mapping[int, Sequence[SharingParty]]
    vram_gb: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SharingView:
    """The caller's device-level view for the share post-filter: the cluster model keeps one
    commitment per device, so who shares a device is the caller's to say."""

    me: SharingParty
    replicas: Mapping[int, ReplicaDevices]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one cycle reads: the cluster model, and what the caller knows beyond it.

    - ``refused``: replica id -> why its host refused the request since the model was read (the
      live scheduler's commit RPCs); the cycle passes over them;
    - ``replica_change``: why a change of the kernel's replicas is under way ("" when none): a
      migration waits for it;
    - ``sharing``: the device view the share post-filter needs (None: no sharing to consider);
    - ``share_refused``: why the hosts refused the last share plans ("": none refused);
    - ``unavailable_hosts``: hosts that take no new container (the live scheduler's draining
      hosts and those whose Local Scheduler does not answer): no container starts there
      (``notebookos.policies.container_cycle``) and no replica migrates there;
    - ``new_replicas``: the replicas a replacement just started, which take the session's GPUs
      first (``container_cycle``'s ``SESSION_GPUS``).
    """

    cluster: Cluster
    refused: Mapping[int, str] = field(default_factory=dict)
    replica_change: str = ""
    sharing: SharingView | None = None
    share_refused: str = ""
    unavailable_hosts: frozenset[str] = frozenset()
    new_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SharePlan:
    replica_id: int
    host_id: str
    device_ids: tuple[int, ...]
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CycleResult:
    """A decision: ``status``, and for ``SUCCESS`` the replica and host and how (``action``).
    ``order`` is the replica order the filter/score walked (the executor first); ``migration``
    the post-filter's migration decision (also when it found no target); ``share`` the share
    plans, best first (the first is the decision; the caller may fall back to the others);
    ``hosts`` the hosts of new containers (``PLACE``/``RESERVE``; for a placement that is not
    ``SUCCESS``, the acceptable hosts found, fewer than asked for)."""

    status: Status
    reason: str = ""
    action: Action = Action.NONE
    replica_id: int | None = None
    host_id: str | None = None
    order: tuple[int, ...] = ()
    migration: MigrationDecision | None = None
    share: tuple[SharePlan, ...] = ()
    hosts: tuple[str, ...] = ()

    @property
    def placed(self) -> bool:
        return self.status is Status.SUCCESS

    def decision(self) -> tuple:
        """What two schedulers must agree on (the decision-equality test compares these)."""
        migration = (None if self.migration is None
                     else (self.migration.replica_id, self.migration.target_host_id))
        share = tuple((p.replica_id, p.host_id, p.device_ids) for p in self.share)
        return (self.status.value, self.action.value, self.replica_id, self.host_id, migration,
                share, self.hosts)


# -- the post-filter plug-ins ------------------------------------------------------------------


@dataclass(slots=True)
class CycleContext:
    snapshot: Snapshot
    kernel: Kernel
    request: ResourceSpec
    policy: Policy
    order: tuple[int, ...]
    why: str  # why nothing fits, so far


class PostFilter:
    """A post-filter plug-in (entry-point group ``notebookos.post_filter``): runs when no
    replica's host can take the request; returns a decision, or None to pass to the next
    plug-in (it may add to ``ctx.why``). Built with its profile configuration section as
    keyword arguments."""

    name: ClassVar[str] = ""

    def post_filter(self, ctx: CycleContext) -> CycleResult | None:
        raise NotImplementedError


class MigratePostFilter(PostFilter):
    """The policy's post-filter: migrate a replica to a host that can bind the request now
    (``Policy.post_filter``), or wait. A kernel of one replica, or one whose replicas are
    changing, waits; a policy that does not migrate waits for its own hosts."""

    name = "migrate"

    def post_filter(self, ctx: CycleContext) -> CycleResult | None:
        policy, kernel, why = ctx.policy, ctx.kernel, ctx.why
        if not policy.supports_migration:
            return CycleResult(Status.WAIT, why, order=ctx.order)
        if len(kernel.live_replicas()) < 2:  # it waits for its own host's GPUs
            return CycleResult(Status.WAIT, f"{why}; {ONE_REPLICA_STAYS}", order=ctx.order)
        if ctx.snapshot.replica_change:  # it waits for that change, and tries again
            return CycleResult(Status.WAIT, f"{why}; {ctx.snapshot.replica_change}",
                               order=ctx.order)
        post = policy.post_filter(ctx.snapshot.cluster, kernel, ctx.request,
                                  ctx.snapshot.unavailable_hosts)
        migration = post.migration
        if post.action is PostFilterAction.MIGRATE and migration is not None \
                and migration.target_host_id is not None:
            return CycleResult(Status.SUCCESS, why, Action.MIGRATE,
                               migration.replica_id, migration.target_host_id, ctx.order,
                               migration)
        reason = post.reason if migration is None else migration.reason
        status = Status.UNSCHEDULABLE if migration is not None else Status.WAIT
        return CycleResult(status, f"{why}, and no host can take a replica of the kernel now "
                           f"({reason})", order=ctx.order, migration=migration)


class SharePostFilter(PostFilter):
    """TensorShare's sharing (``notebookos.policies.gpu_sharing``): join devices other cells
    hold where the sharing decision accepts the pair, on the replicas' hosts in the cycle's
    order. Tried before migrating: sharing moves nothing. Configuration: ``predictor``."""

    name = "share"

    def __init__(self, predictor: str = "auto", sharing: GpuSharing | None = None) -> None:
        self.predictor = predictor
        self._sharing = sharing

    @property
    def sharing(self) -> GpuSharing:
        if self._sharing is None:  # trained on first use: the predictor costs seconds
            self._sharing = GpuSharing(self.predictor)
        return self._sharing

    def post_filter(self, ctx: CycleContext) -> CycleResult | None:
        view = ctx.snapshot.sharing
        if view is None or ctx.request.gpus < 1:
            return None
        if ctx.snapshot.share_refused:
            ctx.why += ctx.snapshot.share_refused
            return None
        if not view.me.shares:
            ctx.why += (f"; not shared: the kernel's gpu_sla is {view.me.gpu_sla:g} (it never "
                        "shares a GPU)")
            return None
        plans: list[SharePlan] = []
        refused: list[str] = []
        for rid in ctx.order:
            replica = view.replicas.get(rid)
            if replica is None:
                continue
            ids, decisions, why = self.sharing.choose(view.me, dict(replica.devices),
                                                      ctx.request.gpus, dict(replica.vram_gb))
            refused += [f"host {replica.host_id} {w}" for w in why]
            if ids:
                plans.append(SharePlan(rid, replica.host_id, tuple(ids),
                                       tuple(d.reason for d in decisions)))
        if plans:
            first = plans[0]
            return CycleResult(Status.SUCCESS, "; ".join(first.reasons), Action.SHARE,
                               first.replica_id, first.host_id, ctx.order, share=tuple(plans))
        if refused:
            ctx.why += f"; not shared: {'; '.join(refused)}"
        return None


# -- the cycle ---------------------------------------------------------------------------------


def executor_order(policy: Policy, cluster: Cluster, kernel: Kernel,
                   request: ResourceSpec) -> tuple[int | None, tuple[int, ...], str]:
    """Filter and score: the policy's executor (None: no replica's host can commit now) and the
    walk: the executor first, then the other live replicas, the most idle host first."""
    decision = policy.choose_executor(cluster, kernel, request)
    live = [r.replica_id for r in kernel.live_replicas()]

    def idle(rid: int) -> int:
        host = cluster.hosts.get(kernel.replicas[rid].host_id)
        return host.idle_gpus if host is not None else -1

    rest = sorted((r for r in live if r != decision.replica_id), key=idle, reverse=True)
    first = [decision.replica_id] if decision.replica_id is not None else []
    return decision.replica_id, tuple(first + rest), decision.reason


def _unresolvable(cluster: Cluster, kernel: Kernel, request: ResourceSpec,
                  policy: Policy) -> str:
    """Why no host of this cluster could ever run ``request`` ("" when one could)."""
    def capacity(host_id: str) -> int:
        host = cluster.hosts.get(host_id)
        return host.capacity.gpus if host is not None else -1

    mine = [capacity(r.host_id) for r in kernel.live_replicas()]
    if not mine or request.gpus <= max(mine):
        return ""
    pool = [h.capacity.gpus for h in cluster.hosts.values()] if policy.supports_migration else []
    if pool and request.gpus <= max(pool):
        return ""
    most = max(mine + pool)
    return (f"the cell asks for {request.gpus} GPU(s) and no host "
            f"{'of the cluster' if pool else 'of its replicas'} has more than {most}")


def first_committable(snapshot: Snapshot, kernel: Kernel, order: Sequence[int],
                      request: ResourceSpec, reasons: list[str]) -> tuple[int | None, str]:
    """The first replica of ``order`` whose host can commit ``request`` now and did not refuse
    it (``snapshot.refused``), with its host; (None, "") when none can. Why each one passed
    over could not is appended to ``reasons``."""
    for rid in order:
        replica = kernel.replicas[rid]
        if rid in snapshot.refused:
            reasons.append(snapshot.refused[rid])
            continue
        host = snapshot.cluster.hosts.get(replica.host_id)
        if host is None:
            reasons.append(f"host {replica.host_id} is gone")
            continue
        if host.can_commit(request, replica.owner):
            return rid, host.host_id
        reasons.append(f"host {host.host_id} has {host.idle_gpus} idle GPU(s)")
    return None, ""


def run_cycle(snapshot: Snapshot, kernel: Kernel | None, request: ResourceSpec,
              profile: Profile) -> CycleResult:
    """One scheduling cycle for ``request`` on ``kernel``: see the module's docstring."""
    if kernel is None:
        return CycleResult(Status.ERROR, "the kernel is not in the cluster model")
    try:
        return _cycle(snapshot, kernel, request, profile)
    except Exception as exc:  # noqa: BLE001 - a plug-in's failure is the request's error
        log.exception("scheduling cycle for kernel %s failed", kernel.kernel_id)
        return CycleResult(Status.ERROR, f"the scheduling cycle failed: "
                           f"{type(exc).__name__}: {exc}")


def _cycle(snapshot: Snapshot, kernel: Kernel, request: ResourceSpec,
           profile: Profile) -> CycleResult:
    cluster, policy = snapshot.cluster, profile.policy
    if not kernel.live_replicas():
        return CycleResult(Status.WAIT, NO_REPLICA)
    executor, order, _ = executor_order(policy, cluster, kernel, request)
    reasons: list[str] = []
    if executor is not None:
        rid, host_id = first_committable(snapshot, kernel, order, request, reasons)
        if rid is not None:
            return CycleResult(Status.SUCCESS, "", Action.EXECUTE, rid, host_id, order)
    else:
        for rid in order:
            host = cluster.hosts.get(kernel.replicas[rid].host_id)
            reasons.append(snapshot.refused.get(rid) or (
                f"host {kernel.replicas[rid].host_id} is gone" if host is None
                else f"host {host.host_id} has {host.idle_gpus} idle GPU(s)"))
    unresolvable = _unresolvable(cluster, kernel, request, policy)
    if unresolvable:
        return CycleResult(Status.UNSCHEDULABLE_AND_UNRESOLVABLE, unresolvable, order=order)
    ctx = CycleContext(snapshot, kernel, request, policy, order,
                       f"every replica's host is busy ({'; '.join(reasons)})")
    for plugin in profile.post_filters:
        result = plugin.post_filter(ctx)
        if result is not None:
            return result
    return CycleResult(Status.WAIT, ctx.why, order=order)


def decisions_equal(a: CycleResult, b: CycleResult) -> bool:
    return a.decision() == b.decision()


__all__ = ["NO_REPLICA", "ONE_REPLICA_STAYS", "Action", "CycleContext", "CycleResult",
           "MigratePostFilter", "PostFilter", "ReplicaDevices", "SharePlan", "SharePostFilter",
           "SharingView", "Snapshot", "Status", "decisions_equal", "executor_order", "run_cycle"]
