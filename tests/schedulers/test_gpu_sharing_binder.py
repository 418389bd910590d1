"""The Local Scheduler's GPU binder with sharing: a device held by one shareable request takes
exactly one more request that asks to share; never three; an exclusive request never lands on a
held device, and an exclusive holder is never joined; releasing one sharer leaves the other."""

from __future__ import annotations

import threading

import pytest

from notebookos.local_scheduler.binding import GpuBinder
from notebookos.local_scheduler.sharing import replica_environment


def test_two_shareable_requests_share_one_device_never_three() -> None:
    binder = GpuBinder([0])
    first = binder.commit("k1/1", "r1", 1, shareable=True)
    assert first.committed and first.device_ids == (0,) and first.shared_ids == ()
    assert binder.idle == 0
    second = binder.commit("k2/1", "r2", 1, [0], share=True)
    assert second.committed and second.device_ids == (0,) and second.shared_ids == (0,)
    assert binder.shared_devices() == {0: ["k1/1", "k2/1"]}
    assert binder.committed_ids() == [0]  # the device once, however many hold it
    third = binder.commit("k3/1", "r3", 1, [0], share=True)
    assert not third.committed
    assert "already shared by two" in third.reason, third.reason
    assert binder.committed_to("k3/1") == []


def test_exclusive_requests_never_land_on_a_held_device() -> None:
    binder = GpuBinder([0])
    assert binder.commit("k1/1", "r1", 1, shareable=True).committed
    refused = binder.commit("k2/1", "r2", 1, [0])  # no share flag: exclusive
    assert not refused.committed and "0 of 1 idle" in refused.reason
    assert binder.commit("k3/1", "r3", 1, [0], share=True).committed
    assert not binder.commit("k4/1", "r4", 1).committed


def test_an_exclusive_holder_is_never_joined() -> None:
    binder = GpuBinder([0, 1])
    assert binder.commit("k1/1", "r1", 1).device_ids == (0,)  # exclusive (gpu_sla 1)
    assert binder.commit("k2/1", "r2", 1, shareable=True).device_ids == (1,)
    assert binder.commit("k3/1", "r3", 1, [0], share=True).committed is False
    joined = binder.commit("k3/1", "r3", 1, [1], share=True)
    assert joined.committed and joined.device_ids == (1,)
    refused = binder.commit("k4/1", "r4", 1, [0, 1], share=True)
    assert not refused.committed
    assert "1 already shared by two, 1 held by a kernel that does not share" in refused.reason


def test_share_prefers_a_free_device_and_joins_only_the_named_ones() -> None:
    binder = GpuBinder([0, 1])
    assert binder.commit("k1/1", "r1", 1, shareable=True).device_ids == (0,)
    free = binder.commit("k2/1", "r2", 1, [0], share=True)
    assert free.device_ids == (1,) and free.shared_ids == ()  # nobody slowed down
    binder.release("r2")
    assert binder.commit("k2/1", "r2b", 1, shareable=True).device_ids == (1,)
    # both held by one shareable request; the share names device 1 only
    joined = binder.commit("k3/1", "r3", 1, [1], share=True)
    assert joined.device_ids == (1,) and joined.shared_ids == (1,)
    assert binder.shared_devices() == {1: ["k2/1", "k3/1"]}


def test_release_of_one_sharer_leaves_the_other_holding_the_device() -> None:
    binder = GpuBinder([0])
    binder.commit("k1/1", "r1", 1, shareable=True)
    binder.commit("k2/1", "r2", 1, [0], share=True)
    assert binder.release("r1") == (0,)
    assert binder.idle == 0 and binder.committed_to("k2/1") == [0]
    assert binder.shared_devices() == {}
    assert not binder.commit("k3/1", "r3", 1).committed  # still held: not for an exclusive one
    assert binder.commit("k3/1", "r3", 1, [0], share=True).committed  # k2 allows one partner
    assert binder.release_owner("k2/1") == (0,)
    assert binder.release_owner("k3/1") == (0,)
    assert binder.idle == 1 and binder.committed_ids() == []
    assert binder.commit("k4/1", "r4", 1).device_ids == (0,)


def test_repeated_commit_is_idempotent_and_one_request_per_replica() -> None:
    binder = GpuBinder([0])
    binder.commit("k1/1", "r1", 1, shareable=True)
    binder.commit("k2/1", "r2", 1, [0], share=True)
    again = binder.commit("k2/1", "r2", 1, [0], share=True)
    assert again.committed and again.reason == "already committed" and again.shared_ids == (0,)
    busy = binder.commit("k2/1", "r9", 1, [0], share=True)
    assert not busy.committed and "still holds GPUs for request r2" in busy.reason


def test_concurrent_sharers_never_make_three() -> None:
    binder = GpuBinder([0])
    binder.commit("k0/1", "r0", 1, shareable=True)
    barrier = threading.Barrier(8)
    won = []

    def join(i: int) -> None:
        barrier.wait()
        if binder.commit(f"k{i + 1}/1", f"r{i + 1}", 1, [0], share=True).committed:
            won.append(i)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert len(binder.shared_devices()[0]) == 2


def test_mps_share_of_a_sharing_replica() -> None:
    assert replica_environment(30) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    assert replica_environment(None) == {}
    with pytest.raises(ValueError, match="1 to 100; got 0"):
        replica_environment(0)


def test_a_migration_waits_for_the_release_not_a_timer() -> None:
    """``PrepareReplicaToMigrate`` waits on the binder: woken by the release (either kind),
    refused after its timeout while the GPUs stay held."""
    import time

    binder = GpuBinder([0, 1])
    assert binder.commit("k/1", "cell-1", 2).committed
    assert binder.wait_released("other/1", 0.0)  # holds nothing: at once
    t0 = time.monotonic()
    assert not binder.wait_released("k/1", 0.2)
    assert time.monotonic() - t0 >= 0.19
    timer = threading.Timer(0.2, binder.release, args=("cell-1",))
    timer.start()
    t0 = time.monotonic()
    assert binder.wait_released("k/1", 10.0)
    assert time.monotonic() - t0 < 2.0
    assert binder.commit("k/1", "cell-2", 1).committed
    threading.Timer(0.1, binder.release_owner, args=("k/1",)).start()
    assert binder.wait_released("k/1", 10.0)
    timer.join()
