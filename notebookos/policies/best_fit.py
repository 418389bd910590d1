"""Best-fit placement, shared by the one-replica policies (reservation, batch, lcp): the host with
the fewest idle GPUs that can still bind the whole request now."""

from __future__ import annotations

from collections.abc import Iterable

from notebookos.cluster import Cluster, Host
from notebookos.policies import placement
from notebookos.policies.base import Policy
from notebookos.resources import ResourceSpec


class BestFitPolicy(Policy):
    """A policy whose replicas go to the best-fitting hosts that can bind the GPUs now."""

    def __init__(self, *, scale_factor: float = 1.0, buffer_hosts: int = 0, **kwargs) -> None:
        super().__init__(scale_factor=scale_factor, buffer_hosts=buffer_hosts, **kwargs)

    def candidate_hosts(self, cluster: Cluster, request: ResourceSpec) -> Iterable[Host]:
        """Best fit: hosts with the fewest idle GPUs that can bind the whole request now."""
        return placement.fewest_idle_first(
            cluster, min_idle=request.gpus, limit=self.candidate_limit
        )
