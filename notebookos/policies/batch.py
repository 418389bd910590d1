"""``batch``: a batch GPU scheduler in front of notebooks: FCFS, a fresh container per cell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from notebookos.cluster import Cluster, Host
from notebookos.policies.base import ContainerLifetime, GpuBinding, Policy
from notebookos.policies.reservation import best_fit_hosts
from notebookos.resources import ResourceSpec


class BatchPolicy(Policy):
    name: ClassVar[str] = "batch"
    replicas_per_kernel: ClassVar[int] = 1
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.CELL
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.CELL
    backfill: ClassVar[bool] = False  # strict first-come first-served
    description: ClassVar[str] = "FCFS queue, a cold container per cell task"

    def __init__(self, *, scale_factor: float = 1.0, buffer_hosts: int = 0, **kwargs) -> None:
        super().__init__(scale_factor=scale_factor, buffer_hosts=buffer_hosts, **kwargs)

    def choose_hosts(
        self,
        cluster: Cluster,
        request: ResourceSpec,
        count: int | None = None,
        exclude: Sequence[str] = (),
    ) -> list[Host] | None:
        """Best fit among hosts that can bind the task's GPUs now."""
        return best_fit_hosts(self, cluster, request, count, exclude)
