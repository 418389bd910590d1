"""Recovery and hibernation meet: recovery leaves a kernel going to sleep or asleep alone.

``_restore_replica_count`` wrote "idle" over "hibernating" when it found the replica count
whole; the hibernation under way then gave up without setting its idle clock again, and the
notebook stayed awake with nothing in the log (the fault campaign, seed 14: two minutes, until
the next fault). And it took a hibernated kernel, whose replicas are stopped on purpose, for
one that had lost them all, and rebuilt it from its checkpoint: a wake no cell asked for.
The service runs in this process (no daemon): the two mixins' decisions are what is tested."""

from __future__ import annotations

import pytest

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
    service._restore_replica_count("k1")
    assert entry.state == "hibernating"


def test_a_hibernated_kernel_is_not_rebuilt_by_recovery(service):
    entry = _kernel(service, "hibernated", replicas=0)
    service._restore_replica_count("k1")
    assert entry.state == "hibernated" and not entry.replicas
