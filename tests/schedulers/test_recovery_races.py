"""Recovery meets hibernation and placement: recovery leaves a kernel going to sleep or asleep
alone, and a cell is not placed on a replacement still starting.

``_restore_replica_count`` wrote "idle" over "hibernating" when it found the replica count
whole; the hibernation under way then gave up without setting its idle clock again, and the
notebook stayed awake with nothing in the log (the fault campaign, seed 14: two minutes, until
the next fault). And it took a hibernated kernel, whose replicas are stopped on purpose, for
one that had lost them all, and rebuilt it from its checkpoint: a wake no cell asked for.
The service runs in this process (no daemon): the two mixins' decisions are what is tested."""

from __future__ import annotations

import pytest

from notebookos.cluster import Host, ReplicaState
from notebookos.global_scheduler.front import ReplicaEndpoint
from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
from notebookos.global_scheduler.registry_store import FileRegistryStore
from notebookos.global_scheduler.service import GlobalSchedulerService
from notebookos.policies import get_policy
from notebookos.resources import ResourceSpec
from notebookos.testing.credentials import connect


@pytest.fixture
def service(tmp_path):  # noqa: ANN201
    svc = GlobalSchedulerService(get_policy("notebookos"),
                                 FileRegistryStore(tmp_path / "registry.json"),
                                 store_url=f"file://{tmp_path}/store", hibernate_after_s=60,
                                 connect=connect)
    yield svc
    svc.close()


def _kernel(service: GlobalSchedulerService, state: str, replicas: int) -> KernelEntry:
    entry = KernelEntry("k1", "key", "hmac-sha256", "python3", {})
    service.cluster.add_kernel("k1", ResourceSpec(millicpus=100, memory_mb=64, gpus=0))
    for rid in range(1, replicas + 1):
        endpoint = ReplicaEndpoint(rid, "127.0.0.1", 1, 2, 3, 4, f"host-{rid}")
        entry.replicas[rid] = ReplicaLink(rid, f"host-{rid}", endpoint, f"127.0.0.1:{rid}", 0,
                                          ready=True)
    entry.state = state
    service.kernels["k1"] = entry
    return entry


def test_a_hibernating_kernel_keeps_its_state_when_recovery_finds_it_whole(service):
    entry = _kernel(service, "hibernating", replicas=3)
    service._restore_replica_count("k1").result(timeout=30)  # the recovery, on the loop
    assert entry.state == "hibernating"


def test_a_hibernated_kernel_is_not_rebuilt_by_recovery(service):
    entry = _kernel(service, "hibernated", replicas=0)
    service._restore_replica_count("k1").result(timeout=30)
    assert entry.state == "hibernated" and not entry.replicas


def test_a_cell_is_not_placed_on_a_replacement_still_starting(service):
    """The cycle chose a replacement the cluster model held but that was not ready (its host
    had the most idle GPUs); the front could not reach it, placed the cell again at once, on
    it again, and failed it after four placements within a millisecond (the fault campaign,
    seed 14: "replica 210 chosen for the cell is not connected")."""
    gpu = ResourceSpec(millicpus=100, memory_mb=64, gpus=1)
    for host_id, gpus in (("host-1", 1), ("host-2", 4)):
        service.cluster.add_host(Host(host_id, ResourceSpec(millicpus=8000, memory_mb=16000,
                                                            gpus=gpus)))
    entry = _kernel(service, "idle", replicas=1)  # replica 1 on host-1, ready
    service.cluster.kernels.pop("k1")
    service.cluster.add_kernel("k1", gpu)
    service.cluster.place_replica("k1", 1, "host-1").state = ReplicaState.RUNNING
    service.cluster.place_replica("k1", 2, "host-2")  # the replacement: starting
    kernel = service.cluster.kernels["k1"]
    with service.lock:
        result = service._cycle(entry, kernel, gpu, {}, "")
    assert result.replica_id == 1, result
