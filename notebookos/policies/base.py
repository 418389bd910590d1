"""The policy interface shared by the live Global Scheduler and the simulator.

A policy is *pure* (DESIGN section 2): it never opens sockets, starts threads, uses asyncio or reads
a clock. It is handed a view of the cluster (a ``notebookos.cluster.Cluster``, read only by
convention) and, where it needs one, the current time as an argument, and it returns a decision.
The caller (scheduler or simulator) applies the decision through the cluster's accounting.

Two families share the interface:

- *session* policies (``notebookos``, ``reservation``, ``batch``, ``lcp``) schedule notebook
  sessions whose cells are short GPU tasks: replicas per kernel, when GPUs are bound, container
  lifetime, host choice, executor choice, migration and autoscaling.
- *job* policies (``fifo``, ``sjf``, ``srtf``, ``tiresias``) order a wait queue of batch jobs on a
  fixed cluster; they say whether they preempt and whether later jobs may overtake a blocked head.
"""

from __future__ import annotations

import enum
import math
from abc import ABC
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from notebookos.cluster import Cluster, Host, Kernel
from notebookos.policies import placement
from notebookos.policies.framework import (
    PER_CELL_BINDING,
    SESSION_BINDING,
    SESSION_CONTAINERS,
    ContainerLifetime,
    ContainerLifetimeStrategy,
    GpuBinding,
    GpuBindingStrategy,
    PostFilterAction,
    PostFilterDecision,
    cell_containers,
)
from notebookos.resources import ResourceSpec


class PolicyKind(enum.StrEnum):
    SESSION = "session"
    JOB = "job"


@dataclass(frozen=True, slots=True)
class ExecutorDecision:
    """Which replica runs a request; ``replica_id is None`` means no replica's host can commit now
    and one must migrate (or the request waits)."""

    replica_id: int | None
    reason: str

    @property
    def migrate(self) -> bool:
        return self.replica_id is None


@dataclass(frozen=True, slots=True)
class MigrationDecision:
    """Move ``replica_id`` to ``target_host_id``; ``target_host_id is None``: no host can take it
    now (the caller scales out and retries)."""

    replica_id: int
    target_host_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class ScalingView:
    """What the autoscaler looks at, gathered by the caller in O(1)."""

    hosts: int  # hosts up, plus hosts being provisioned
    gpus_per_host: int
    committed_gpus: int  # GPUs bound now
    waiting_gpus: int  # GPUs asked for by requests that wait for capacity
    subscribed_gpus: int  # sum of replica subscriptions
    releasable_host_ids: Sequence[str] = ()  # hosts holding nothing, fewest first by the caller
    waiting_hosts: int = 0  # whole hosts asked for by kernels whose replicas found no host


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    add_hosts: int = 0
    release_host_ids: tuple[str, ...] = ()


@dataclass(slots=True)
class QueuedJob:
    """A batch job as job policies see it (the simulator keeps these up to date)."""

    job_id: str
    submit_time: float
    num_gpus: int
    duration: float  # oracle total run time
    remaining: float  # run time still to go
    attained_gpu_s: float = 0.0  # GPU-seconds of service received so far (Tiresias's 2D age)
    seq: int = 0  # arrival order, the final tie-breaker
    name: str = ""  # the job's model or name, where the trace has one
    user: str = ""  # who submitted it, where the trace says


class Policy(ABC):  # noqa: B024 - every method has a sensible default; subclasses override some
    """Base of every policy. Class attributes describe it; methods return decisions.

    Each method is one extension point of ``notebookos.policies.framework`` with a working
    default; a policy overrides the points it needs.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[PolicyKind] = PolicyKind.SESSION
    replicas_per_kernel: ClassVar[int] = 1
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.CELL
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.SESSION
    supports_migration: ClassVar[bool] = False
    preemptive: ClassVar[bool] = False  # job policies: may running jobs be preempted
    backfill: ClassVar[bool] = True  # job policies: may a later job start when the head is blocked
    description: ClassVar[str] = ""

    def __init__(
        self,
        *,
        scale_factor: float = 1.05,
        buffer_hosts: int = 0,
        min_hosts: int = 0,
        max_release_per_tick: int = 2,
        candidate_limit: int = 64,
    ) -> None:
        if scale_factor < 1.0:
            raise ValueError(f"scale_factor={scale_factor!r} must be >= 1.0")
        if buffer_hosts < 0 or min_hosts < 0 or max_release_per_tick < 0 or candidate_limit < 1:
            raise ValueError("buffer_hosts, min_hosts, max_release_per_tick must be >= 0 and "
                             "candidate_limit >= 1")
        self.scale_factor = float(scale_factor)
        self.buffer_hosts = int(buffer_hosts)
        self.min_hosts = int(min_hosts)
        self.max_release_per_tick = int(max_release_per_tick)
        self.candidate_limit = int(candidate_limit)

    # -- strategies (reserve/unreserve, container lifetime) -------------------------------------

    @property
    def binding(self) -> GpuBindingStrategy:
        """Reserve/unreserve: when GPUs are bound. Default: from ``gpu_binding``."""
        return SESSION_BINDING if self.gpu_binding == GpuBinding.SESSION else PER_CELL_BINDING

    @property
    def lifetime(self) -> ContainerLifetimeStrategy:
        """Container lifetime. Default: from ``container_lifetime`` (a migrating policy with
        session containers keeps a prewarm pool; a cell container pays a cold start)."""
        if self.container_lifetime == ContainerLifetime.CELL:
            return cell_containers(state_io=True)
        if self.supports_migration:
            return ContainerLifetimeStrategy(ContainerLifetime.SESSION, prewarm_pool=True)
        return SESSION_CONTAINERS

    # -- filter and score (session policies) ----------------------------------------------------

    def host_acceptable(self, cluster: Cluster, host: Host, request: ResourceSpec) -> bool:
        """Filter: whether a new replica of ``request`` may be placed on ``host`` (besides
        distinctness)."""
        if not host.can_subscribe(request):
            return False
        if self.binding.placement_needs_free_gpus or self.lifetime.placement_needs_free_gpus:
            return host.can_commit(request)
        return True

    def candidate_hosts(self, cluster: Cluster, request: ResourceSpec) -> Iterable[Host]:
        """Score (the walk): the hosts ``choose_hosts`` considers, best first: the most idle GPUs
        first, at most ``candidate_limit`` of them."""
        return placement.most_idle_first(cluster, min_idle=0, limit=self.candidate_limit)

    def score(self, cluster: Cluster, host: Host, request: ResourceSpec) -> float | None:
        """Score (optional re-rank): higher is better. ``None`` (the default) keeps the order of
        ``candidate_hosts``. A policy that overrides it has the acceptable hosts of the bounded
        walk sorted by score (ties keep the walk's order)."""
        return None

    def _scores_hosts(self) -> bool:
        return type(self).score is not Policy.score

    def choose_hosts(
        self,
        cluster: Cluster,
        request: ResourceSpec,
        count: int | None = None,
        exclude: Sequence[str] = (),
    ) -> list[Host] | None:
        """Distinct hosts for ``count`` new replicas (default: ``replicas_per_kernel``), or None.

        Default: hosts with the most idle GPUs first, through the cluster's idle-GPU index, looking
        at no more than ``candidate_limit`` hosts (so the cost does not grow with the cluster).
        """
        count = self.replicas_per_kernel if count is None else count
        chosen = self.acceptable_hosts(cluster, request, count, exclude)
        return chosen if len(chosen) == count else None

    def acceptable_hosts(
        self,
        cluster: Cluster,
        request: ResourceSpec,
        count: int | None = None,
        exclude: Sequence[str] = (),
    ) -> list[Host]:
        """Up to ``count`` distinct acceptable hosts, best first (fewer when fewer exist among the
        bounded walk): ``choose_hosts`` without the all-or-nothing, so that a caller whose
        placement failed knows how many hosts it lacks."""
        count = self.replicas_per_kernel if count is None else count
        chosen: list[Host] = []
        skip = set(exclude)
        scoring = self._scores_hosts()
        for host in self.candidate_hosts(cluster, request):
            if host.host_id in skip or not self.host_acceptable(cluster, host, request):
                continue
            chosen.append(host)
            skip.add(host.host_id)
            if len(chosen) == count and not scoring:
                return chosen
        if scoring:
            ranked = sorted(enumerate(chosen),
                            key=lambda item: (-(self.score(cluster, item[1], request) or 0.0),
                                              item[0]))
            return [host for _, host in ranked[:count]]
        return chosen

    def choose_executor(
        self, cluster: Cluster, kernel: Kernel, request: ResourceSpec
    ) -> ExecutorDecision:
        """Sticky: the last executor if its host can commit ``request`` now; else the replica whose
        host has the most idle GPUs and can commit; else migrate."""
        replicas = {r.replica_id: r for r in kernel.live_replicas()}
        last = kernel.executor
        if last is not None and last in replicas:
            host = cluster.hosts.get(replicas[last].host_id)
            if host is not None and host.can_commit(request, replicas[last].owner):
                return ExecutorDecision(last, "last executor's host can commit")
        best: tuple[int, int] | None = None
        for rid, replica in sorted(replicas.items()):
            host = cluster.hosts.get(replica.host_id)
            if host is None or not host.can_commit(request, replica.owner):
                continue
            if best is None or host.idle_gpus > best[0]:
                best = (host.idle_gpus, rid)
        if best is not None:
            return ExecutorDecision(best[1], "replica whose host has the most idle GPUs")
        return ExecutorDecision(None, "no replica's host can commit the request now")

    def post_filter(
        self, cluster: Cluster, kernel: Kernel, request: ResourceSpec,
        exclude: Collection[str] = (),
    ) -> PostFilterDecision:
        """Post-filter: no replica's host can run ``request`` now. Default: a migrating policy
        migrates (``choose_migration``, never to a host of ``exclude``; WAIT when no target
        host exists), others wait."""
        migration = self.choose_migration(cluster, kernel, request, exclude)
        if migration is None:
            return PostFilterDecision(PostFilterAction.WAIT, "the policy does not migrate")
        if migration.target_host_id is None:
            return PostFilterDecision(PostFilterAction.WAIT, migration.reason, migration)
        return PostFilterDecision(PostFilterAction.MIGRATE, migration.reason, migration)

    def choose_migration(
        self, cluster: Cluster, kernel: Kernel, request: ResourceSpec,
        exclude: Collection[str] = (),
    ) -> MigrationDecision | None:
        """Which replica to move and where (never to a host of ``exclude``: the caller's hosts
        that take no new container, draining or not answering); None when the policy does not
        migrate."""
        if not self.supports_migration:
            return None
        replicas = sorted(kernel.live_replicas(), key=lambda r: r.replica_id)
        if not replicas:
            return None
        # Move the replica on the most subscribed host: it relieves the hottest host.
        def heat(r):  # noqa: ANN001, ANN202
            host = cluster.hosts.get(r.host_id)
            return -1.0 if host is None else host.subscription_ratio(self.replicas_per_kernel)

        victim = max(replicas, key=heat)
        occupied = {r.host_id for r in replicas} | set(exclude)
        for host in placement.most_idle_first(
            cluster, min_idle=request.gpus, limit=self.candidate_limit
        ):
            if host.host_id in occupied:
                continue
            if self.host_acceptable(cluster, host, request) and host.can_commit(request):
                return MigrationDecision(victim.replica_id, host.host_id,
                                         "host with the most idle GPUs that can commit now")
        return MigrationDecision(victim.replica_id, None, "no host can commit the request now")

    def scaling(self, view: ScalingView) -> ScalingDecision:
        """The paper's two scale-out triggers (3.4.2): expected capacity = committed GPUs x
        scale_factor, in hosts, plus a buffer of spare hosts; and a failed placement, which asks
        for the hosts the waiting requests lack (their GPUs in whole hosts, and the hosts that
        waiting kernels' replicas found none for). Scale out when below, release up to
        ``max_release_per_tick`` idle hosts when above."""
        target = self.target_hosts(view)
        if view.hosts < target:
            return ScalingDecision(add_hosts=target - view.hosts)
        surplus = min(view.hosts - target, self.max_release_per_tick)
        if surplus > 0 and view.releasable_host_ids:
            return ScalingDecision(release_host_ids=tuple(view.releasable_host_ids[:surplus]))
        return ScalingDecision()

    def target_hosts(self, view: ScalingView) -> int:
        """The number of hosts the cluster should have now."""
        gph = max(1, view.gpus_per_host)
        # Waiting requests count in whole new hosts: the GPUs free on existing hosts did not fit
        # them (fragmentation), so counting them against existing capacity could starve them.
        target = math.ceil(view.committed_gpus * self.scale_factor / gph) + math.ceil(
            view.waiting_gpus / gph) + view.waiting_hosts
        return max(self.min_hosts, target + self.buffer_hosts, self.subscription_hosts(view))

    def subscription_hosts(self, view: ScalingView) -> int:
        """Hosts needed to hold the subscriptions (0 for policies that do not oversubscribe)."""
        return 0

    scale_in: ClassVar[str] = "idle"  # release hosts with no GPU bound (moving their replicas)

    def observe(self, cluster: Cluster) -> None:  # noqa: B027 - optional hook
        """Called once per scaling interval with the cluster; stateful policies update here."""

    # -- job policies -----------------------------------------------------------------------

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        """Queue ordering: sort key of a job; smaller runs first. The key of a *waiting* job must not change while
        it waits (the simulator keeps waiting jobs sorted by it)."""
        return (job.submit_time, job.seq)

    def order_queue(self, jobs: Sequence[QueuedJob], now: float) -> list[QueuedJob]:
        return sorted(jobs, key=lambda j: self.priority_key(j, now))

    def next_priority_change(self, job: QueuedJob, now: float) -> float | None:
        """For a *running* job: the time at which its key changes in a way that can reorder the
        queue (Tiresias's demotion); None when never."""
        return None
