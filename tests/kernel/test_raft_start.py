"""A new group's first election without pysyncobj's waits (kernel/raft_start.py), in-process
RaftLogs on loopback (real pysyncobj, real sockets)."""

from __future__ import annotations

import time

from notebookos.kernel.raft_log import RaftLog
from notebookos.ports import free_ports


def start_group(quick: list[bool]) -> list[RaftLog]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(len(quick))]
    members = {i + 1: a for i, a in enumerate(addresses)}
    return [RaftLog(a, [b for b in addresses if b != a], members, b"key",
                    on_commit=lambda _r, _a: None, quick_start=q)
            for a, q in zip(addresses, quick, strict=True)]


def wait_leader(logs: list[RaftLog], timeout: float = 10.0) -> tuple[int, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for i, log in enumerate(logs):
            if log._sync._isLeader():
                return i, time.monotonic() - t0
        time.sleep(0.005)
    raise TimeoutError("no leader")


def test_founders_elect_at_once_and_then_use_normal_timings():
    logs = start_group([True, True, True])
    try:
        leader, _took = wait_leader(logs)
        deadline = time.monotonic() + 5
        while any(log.quick_start.active for log in logs) and time.monotonic() < deadline:
            time.sleep(0.01)
        for log in logs:  # done after the first leader: pysyncobj's own retry time is back
            assert not log.quick_start.active
            assert log._sync._SyncObj__conf.connectionRetryTime == 0.2
        assert logs[leader].has_quorum()
    finally:
        for log in logs:
            log.close()


def test_quick_start_is_faster_than_pysyncobjs_first_election():
    """Median of three starts each way (the 2-core VM is shared: generous margin)."""
    quick, normal = [], []
    for _ in range(3):
        for flag, out in ((True, quick), (False, normal)):
            logs = start_group([flag] * 3)
            try:
                out.append(wait_leader(logs)[1])
            finally:
                for log in logs:
                    log.close()
    quick.sort()
    normal.sort()
    assert quick[1] < normal[1], (quick, normal)


def test_a_joining_replica_never_campaigns_early():
    logs = start_group([True, True, False])
    try:
        wait_leader(logs)
        assert logs[2].quick_start is None
    finally:
        for log in logs:
            log.close()


def test_a_member_without_the_kernel_key_learns_nothing():
    """Raft traffic is encrypted with a key derived from the kernel key: a member started with
    another key neither joins the election nor sees a committed record."""
    from notebookos.kernel.records import Proposal

    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    members = {i + 1: a for i, a in enumerate(addresses)}
    seen: list[list[object]] = [[], [], []]
    logs = [RaftLog(a, [b for b in addresses if b != a], members, key,
                    on_commit=lambda r, _a, i=i: seen[i].append(r), quick_start=True)
            for i, (a, key) in enumerate(zip(addresses, [b"key", b"key", b"other"],
                                             strict=True))]
    try:
        leader, _ = wait_leader(logs[:2])
        done = []
        logs[leader].propose(Proposal("cell-1", leader + 1, "LEAD"),
                             on_done=lambda ok, _r: done.append(ok))
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done == [True]
        time.sleep(1.0)
        assert seen[0] and seen[1], seen
        assert seen[2] == [] and not logs[2]._sync._isLeader()
        assert logs[2]._sync._getLeader() is None
    finally:
        for log in logs:
            log.close()
