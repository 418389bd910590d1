"""``batch``: a batch GPU scheduler in front of notebooks: FCFS, a fresh container per cell."""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import ContainerLifetime, GpuBinding
from notebookos.policies.best_fit import BestFitPolicy


class BatchPolicy(BestFitPolicy):
    name: ClassVar[str] = "batch"
    replicas_per_kernel: ClassVar[int] = 1
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.CELL
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.CELL
    backfill: ClassVar[bool] = False  # strict first-come first-served
    description: ClassVar[str] = "FCFS queue, a cold container per cell task"
