"""``lcp``: NotebookOS with a large pool of warm containers; a cell borrows one and returns it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from notebookos.cluster import Cluster, Host
from notebookos.policies.base import ContainerLifetime, GpuBinding, Policy
from notebookos.policies.reservation import best_fit_hosts
from notebookos.resources import ResourceSpec


class LCPPolicy(Policy):
    name: ClassVar[str] = "lcp"
    replicas_per_kernel: ClassVar[int] = 1
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.CELL
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.CELL
    backfill: ClassVar[bool] = True  # a warm container anywhere serves the next request that fits
    description: ClassVar[str] = "large warm container pool: cells borrow a warm container"

    def __init__(
        self,
        *,
        warm_containers_per_host: int = 8,
        scale_factor: float = 1.05,
        buffer_hosts: int = 1,
        **kwargs,
    ) -> None:
        super().__init__(scale_factor=scale_factor, buffer_hosts=buffer_hosts, **kwargs)
        if warm_containers_per_host < 0:
            raise ValueError(f"warm_containers_per_host={warm_containers_per_host!r} must be >= 0")
        self.warm_containers_per_host = int(warm_containers_per_host)

    def choose_hosts(
        self,
        cluster: Cluster,
        request: ResourceSpec,
        count: int | None = None,
        exclude: Sequence[str] = (),
    ) -> list[Host] | None:
        """Best fit among hosts that can bind the task's GPUs now."""
        return best_fit_hosts(self, cluster, request, count, exclude)
