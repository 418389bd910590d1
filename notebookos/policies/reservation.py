"""``reservation``: today's notebook platforms (Colab, Sensei): one container per session with its
GPUs bound for the session's whole life."""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import ContainerLifetime, GpuBinding
from notebookos.policies.best_fit import BestFitPolicy


class ReservationPolicy(BestFitPolicy):
    name: ClassVar[str] = "reservation"
    replicas_per_kernel: ClassVar[int] = 1
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.SESSION
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.SESSION
    description: ClassVar[str] = "one container per session, GPUs reserved for the session's life"
