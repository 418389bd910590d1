"""Building the simulated cluster from the core model (the same accounting code the live
Global Scheduler uses), and host capacities for simulated VMs."""

from __future__ import annotations

from notebookos.cluster import Cluster, Host
from notebookos.resources import ResourceSpec

# A simulated GPU VM: per GPU 8 vCPUs, 64 GB of memory and 40 GB of GPU memory (p4d-like shape).
MILLICPUS_PER_GPU = 8000
MEMORY_MB_PER_GPU = 64_000
VRAM_GB_PER_GPU = 40.0


def host_capacity(gpus: int, gpus_only: bool = False) -> ResourceSpec:
    if gpus_only:
        return ResourceSpec(gpus=gpus)
    return ResourceSpec(MILLICPUS_PER_GPU * gpus, MEMORY_MB_PER_GPU * gpus, gpus,
                        VRAM_GB_PER_GPU * gpus)


class HostFactory:
    """Adds numbered hosts of one shape to a cluster."""

    def __init__(self, cluster: Cluster, gpus_per_host: int, oversubscription: float,
                 gpus_only: bool = False) -> None:
        self.cluster = cluster
        self.capacity = host_capacity(gpus_per_host, gpus_only)
        self.oversubscription = max(1.0, oversubscription)
        self.next_index = 0

    def new_host(self) -> Host:
        host = Host(f"host-{self.next_index:05d}", self.capacity,
                    oversubscription=self.oversubscription)
        self.next_index += 1
        return self.cluster.add_host(host)
