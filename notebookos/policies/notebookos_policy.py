"""``notebookos``: the paper's default policy (3 replicas, GPUs bound per cell, migration)."""

from __future__ import annotations

import math
from collections import deque
from typing import ClassVar

from notebookos.cluster import Cluster, Host
from notebookos.policies.base import (
    ContainerLifetime,
    GpuBinding,
    Policy,
    ScalingView,
)
from notebookos.resources import ResourceSpec


class NotebookOSPolicy(Policy):
    """Three replicas per kernel on distinct hosts; a replica subscribes the kernel's request and
    GPUs are committed to the executor only while a cell runs. A host is refused when its
    subscription ratio SR = subscribed GPUs / (host GPUs x R) would pass the cluster-wide limit.

    The limit is dynamic (``subscription_ratio_limit=None``): the mean over the last
    ``ratio_window`` scaling ticks of demand/busy (demand = subscribed GPUs / R, busy = committed
    GPUs), clamped to [1, ``max_subscription_ratio``]; the maximum when nothing is busy. A number
    fixes it instead.
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
        max_subscription_ratio: float = 7.0,
        ratio_window: int = 5,
        scale_factor: float = 1.05,
        buffer_hosts: int = 2,
        min_hosts: int = 3,
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
        self.fixed_limit = subscription_ratio_limit
        self.max_subscription_ratio = float(max_subscription_ratio)
        self._samples: deque[float] = deque(maxlen=int(ratio_window))

    @property
    def subscription_ratio_limit(self) -> float:
        if self.fixed_limit is not None:
            return self.fixed_limit
        if not self._samples:
            return self.max_subscription_ratio
        return sum(self._samples) / len(self._samples)

    def observe(self, cluster: Cluster) -> None:
        demand = cluster.subscribed_gpus / self.replicas_per_kernel
        busy = cluster.committed_gpus
        if busy <= 0:
            sample = self.max_subscription_ratio
        else:
            sample = min(self.max_subscription_ratio, max(1.0, demand / busy))
        self._samples.append(sample)

    def host_acceptable(self, cluster: Cluster, host: Host, request: ResourceSpec) -> bool:
        if not host.can_subscribe(request) or host.capacity.gpus < request.gpus:
            return False
        if host.capacity.gpus == 0:
            return request.gpus == 0
        ratio = (host.subscribed.gpus + request.gpus) / (
            host.capacity.gpus * self.replicas_per_kernel
        )
        return ratio <= self.subscription_ratio_limit + 1e-9

    def subscription_hosts(self, view: ScalingView) -> int:
        per_host = view.gpus_per_host * self.replicas_per_kernel * self.subscription_ratio_limit
        return math.ceil(view.subscribed_gpus / per_host) if per_host > 0 else 0
