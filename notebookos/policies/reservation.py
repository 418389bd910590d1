"""``reservation``: today's notebook platforms (Colab, Sensei): one container per session with its
GPUs bound for the session's whole life."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from notebookos.cluster import Cluster, Host
from notebookos.policies import placement
from notebookos.policies.base import ContainerLifetime, GpuBinding, Policy
from notebookos.resources import ResourceSpec


class ReservationPolicy(Policy):
    name: ClassVar[str] = "reservation"
    replicas_per_kernel: ClassVar[int] = 1
    gpu_binding: ClassVar[GpuBinding] = GpuBinding.SESSION
    container_lifetime: ClassVar[ContainerLifetime] = ContainerLifetime.SESSION
    description: ClassVar[str] = "one container per session, GPUs reserved for the session's life"

    def __init__(self, *, scale_factor: float = 1.0, buffer_hosts: int = 0, **kwargs) -> None:
        super().__init__(scale_factor=scale_factor, buffer_hosts=buffer_hosts, **kwargs)

    def choose_hosts(
        self,
        cluster: Cluster,
        request: ResourceSpec,
        count: int | None = None,
        exclude: Sequence[str] = (),
    ) -> list[Host] | None:
        """Best fit: the host with the fewest idle GPUs that can bind the whole request now."""
        return best_fit_hosts(self, cluster, request, count, exclude)


def best_fit_hosts(
    policy: Policy,
    cluster: Cluster,
    request: ResourceSpec,
    count: int | None,
    exclude: Sequence[str],
) -> list[Host] | None:
    count = policy.replicas_per_kernel if count is None else count
    chosen: list[Host] = []
    skip = set(exclude)
    for host in placement.fewest_idle_first(
        cluster, min_idle=request.gpus, limit=policy.candidate_limit
    ):
        if host.host_id in skip or not policy.host_acceptable(cluster, host, request):
            continue
        chosen.append(host)
        skip.add(host.host_id)
        if len(chosen) == count:
            return chosen
    return None
