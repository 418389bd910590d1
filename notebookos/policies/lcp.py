"""``lcp``: NotebookOS with a large pool of warm containers; a cell borrows one and returns it."""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import ContainerLifetime, GpuBinding
from notebookos.policies.best_fit import BestFitPolicy
from notebookos.policies.framework import ContainerLifetimeStrategy, cell_containers


class LCPPolicy(BestFitPolicy):
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

    @property
    def lifetime(self) -> ContainerLifetimeStrategy:
        """A container per cell, borrowed from the host's warm pool."""
        return cell_containers(warm_per_host=self.warm_containers_per_host)
