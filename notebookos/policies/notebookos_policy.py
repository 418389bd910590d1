"""``notebookos``: the paper's default policy (3 replicas, GPUs bound per cell, migration)."""

from __future__ import annotations

import math
from collections import deque
from typing import ClassVar

from notebookos.cluster import Cluster, Host
from notebookos.policies import defaults
from notebookos.policies.base import (
    ContainerLifetime,
    GpuBinding,
    Policy,
    ScalingView,
)
from notebookos.resources import ResourceSpec

SR_LIMITS = ("paper", "prototype")
SCALE_IN = ("idle", "empty", "drain")


class NotebookOSPolicy(Policy):
    """Three replicas per kernel on distinct hosts; a replica subscribes the kernel's request and
    GPUs are committed to the executor only while a cell runs. A host is refused when its
    subscription ratio SR = subscribed GPUs / (host GPUs x R) would pass the cluster-wide limit.

    The limit (``sr_limit_for``, the one place it is computed, for the Global Scheduler and the
    simulator alike):

    - ``sr_limit="paper"`` (default, section 3.4.1): total subscribed GPUs / total GPUs of the
      cluster, recomputed at every placement, kept in [1, ``max_subscription_ratio``] (1: the SR at
      which the paper says every replica can still get its GPUs; the maximum: the hosts' own cap);
    - ``sr_limit="prototype"`` (the authors' prototype's ``UpdateRatio``): the mean over the last
      ``ratio_window`` scaling ticks of demand/busy (demand = subscribed GPUs / R, busy = committed
      GPUs), in [1, ``max_subscription_ratio``]; the maximum while nothing is busy;
    - ``subscription_ratio_limit=X``: fixed at X.

    Scale-in (``scale_in``): ``empty`` (default: release 1-2 hosts that hold no replica; the paper
    describes no moving of standby replicas to release a host, and moving them is what cost the
    executor reuse), ``idle`` (the literal "idle servers" of 3.4.2, no GPU bound: their standby
    replicas move to other hosts first; what the live autoscaler does; it thrashes on long traces,
    see docs/evaluation.md) or ``drain`` (the prototype's: idle hosts are emptied only when the
    surplus passes a hysteresis, at most every 10 intervals, fewest last executors first; the
    simulator's setting ``drain_hysteresis_hosts``). ``scale_for_subscriptions`` adds hosts until
    the subscriptions fit under the limit (not in the paper's autoscaler); by default it is on only
    when the limit cannot grow with the subscriptions (a fixed limit, or a maximum of 1), where
    without it the cluster would be too small to place kernels.

    The defaults live in ``notebookos.policies.defaults``, which the live configuration's
    defaults (``cluster.max_subscription_ratio``, ``global_scheduler.scale_in``...) also read.
    """

    name: ClassVar[str] = "notebookos"
    replicas_per_kernel: ClassVar[int] = 3
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.CELL
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.SESSION
    supports_migration: ClassVar[bool] = True
    description: ClassVar[str] = "3 Raft replicas, GPUs bound per cell, oversubscription, migration"

    def __init__(
        self,
        *,
        subscription_ratio_limit: float | None = None,
        sr_limit: str = defaults.SR_LIMIT,
        max_subscription_ratio: float = defaults.MAX_SUBSCRIPTION_RATIO,
        ratio_window: int = 5,
        scale_factor: float = defaults.SCALE_FACTOR,
        buffer_hosts: int = 2,
        min_hosts: int = defaults.MIN_HOSTS,
        scale_in: str = defaults.SCALE_IN,
        scale_for_subscriptions: bool | None = None,
        **kwargs,
    ) -> None:
        super().__init__(scale_factor=scale_factor, buffer_hosts=buffer_hosts,
                         min_hosts=min_hosts, **kwargs)
        if max_subscription_ratio < 1.0:
            raise ValueError(f"max_subscription_ratio={max_subscription_ratio!r} must be >= 1")
        if subscription_ratio_limit is not None and subscription_ratio_limit <= 0:
            raise ValueError(f"subscription_ratio_limit={subscription_ratio_limit!r} must be > 0")
        if ratio_window < 1:
            raise ValueError(f"ratio_window={ratio_window!r} must be >= 1")
        if sr_limit not in SR_LIMITS:
            raise ValueError(f"sr_limit={sr_limit!r} must be one of {', '.join(SR_LIMITS)}")
        if scale_in not in SCALE_IN:
            raise ValueError(f"scale_in={scale_in!r} must be one of {', '.join(SCALE_IN)}")
        self.fixed_limit = subscription_ratio_limit
        self.sr_limit = sr_limit
        self.max_subscription_ratio = float(max_subscription_ratio)
        self.scale_in = scale_in
        # The paper's limit grows with the subscriptions, so the cluster need not grow for them;
        # a limit that cannot grow (fixed, or a maximum of 1) needs the hosts.
        fixed = subscription_ratio_limit is not None or max_subscription_ratio <= 1.0
        self.scale_for_subscriptions = (fixed if scale_for_subscriptions is None
                                        else bool(scale_for_subscriptions))
        self._samples: deque[float] = deque(maxlen=int(ratio_window))
        self._last_limit = self.max_subscription_ratio if self.fixed_limit is None \
            else self.fixed_limit

    # -- the subscription-ratio limit: computed here and only here ---------------------------

    def sr_limit_for(self, cluster: Cluster) -> float:
        """The cluster-wide SR limit now (see the class docstring for the variants)."""
        if self.fixed_limit is not None:
            limit = self.fixed_limit
        elif self.sr_limit == "prototype":
            limit = (sum(self._samples) / len(self._samples) if self._samples
                     else self.max_subscription_ratio)
        else:
            total = cluster.total_gpus
            ratio = cluster.subscribed_gpus / total if total > 0 else self.max_subscription_ratio
            limit = min(self.max_subscription_ratio, max(1.0, ratio))
        self._last_limit = limit
        return limit

    @property
    def subscription_ratio_limit(self) -> float:
        """The limit as last computed (what ``notebookos status`` shows)."""
        return self._last_limit

    def observe(self, cluster: Cluster) -> None:
        """Once per scaling interval: the prototype's window takes a sample."""
        if self.fixed_limit is None and self.sr_limit == "prototype":
            demand = cluster.subscribed_gpus / self.replicas_per_kernel
            busy = cluster.committed_gpus
            if busy <= 0:
                sample = self.max_subscription_ratio
            else:
                sample = min(self.max_subscription_ratio, max(1.0, demand / busy))
            self._samples.append(sample)
        self.sr_limit_for(cluster)

    def host_acceptable(self, cluster: Cluster, host: Host, request: ResourceSpec) -> bool:
        if not host.can_subscribe(request) or host.capacity.gpus < request.gpus:
            return False
        if host.capacity.gpus == 0:
            return request.gpus == 0
        ratio = (host.subscribed.gpus + request.gpus) / (
            host.capacity.gpus * self.replicas_per_kernel
        )
        return ratio <= self.sr_limit_for(cluster) + 1e-9

    def subscription_hosts(self, view: ScalingView) -> int:
        if not self.scale_for_subscriptions:
            return 0
        per_host = view.gpus_per_host * self.replicas_per_kernel * self._last_limit
        return math.ceil(view.subscribed_gpus / per_host) if per_host > 0 else 0
