"""An idle replica group rests its Raft timers (kernel/raft_rest.py), on real processes.

Resting must cost nothing but idle CPU: the next cell runs on every replica as before, a member
killed while the group rests is replaced by an election as fast as in an awake group, and a group
that woke rests again.
"""

from __future__ import annotations

import time

import psutil
from harness import ReplicaGroup


def all_resting(status: dict[int, dict]) -> bool:
    return all(s.get("raft_resting") for s in status.values())


def cpu_seconds(group: ReplicaGroup) -> float:
    total = 0.0
    for rid in group.alive_ids():
        times = psutil.Process(group.replicas[rid].proc.pid).cpu_times()
        total += times.user + times.system
    return total


def test_idle_group_rests_and_the_next_cell_wakes_it(group: ReplicaGroup):
    group.execute("x = 1", target=1)
    group.wait_status(all_resting, timeout=30)
    result = group.execute("x += 1\nprint(x)", target=1)
    assert result.stdout() == "2\n", result.summary()
    for rid in (2, 3):
        assert result.reply(rid)["content"]["status"] == "ok", result.summary()
    # another replica runs the next cell: leadership moves, and the group still agrees
    other = group.execute("print(x * 10)", target=2)
    assert other.executor() == 2 and other.stdout() == "20\n", other.summary()
    group.wait_status(all_resting, timeout=30)


def test_resting_group_spends_a_fraction_of_an_awake_one(group: ReplicaGroup):
    """Generous bound (the machine is shared): awake, three replicas spend 25-40 ms/s."""
    group.execute("x = 1", target=1)
    group.wait_status(all_resting, timeout=30)
    before, t0 = cpu_seconds(group), time.monotonic()
    time.sleep(4.0)
    rate = (cpu_seconds(group) - before) / (time.monotonic() - t0) * 1e3
    assert rate < 12.0, f"a resting group spent {rate:.1f} ms of CPU per second"


def test_executor_killed_while_the_group_rests(group: ReplicaGroup):
    group.execute("state = {'a': 1}", target=1)
    group.wait_status(all_resting, timeout=30)
    group.kill(1)  # the executor leads Raft
    t0 = time.monotonic()
    result = group.execute("state['b'] = 2\nprint(sorted(state))", target=2, to=[2, 3])
    failover = time.monotonic() - t0
    assert result.executor() == 2 and result.stdout() == "['a', 'b']\n", result.summary()
    assert result.reply(3)["content"]["status"] == "ok", result.summary()
    assert failover < 5.0


def test_standby_killed_while_the_group_rests(group: ReplicaGroup):
    group.execute("v = 5", target=1)
    group.wait_status(all_resting, timeout=30)
    group.kill(3)
    result = group.execute("print(v + 1)", target=1, to=[1, 2])
    assert result.executor() == 1 and result.stdout() == "6\n", result.summary()
    assert result.reply(2)["content"]["status"] == "ok", result.summary()
    # the survivors' follower rests although pysyncobj keeps trying to reach replica 3
    group.wait_status(lambda s: s[2]["raft_resting"] or s[1]["raft_resting"], timeout=30)


def test_times_written_into_pysyncobj_are_on_its_clock():
    """pysyncobj times everything on CLOCK_MONOTONIC_RAW, which drifts from time.monotonic()
    (0.25 s after 43 minutes of uptime on the 2-core VM, about 8 s a day): a woken follower's
    election deadline written on the other clock fired late by the drift."""
    from pysyncobj.monotonic import monotonic as raft_clock

    from notebookos.kernel.raft_log import RaftLog
    from notebookos.ports import free_ports

    log = RaftLog(f"127.0.0.1:{free_ports(1)[0]}", [], {1: "x"}, b"key",
                  on_commit=lambda _r, _a: None, raft_min_timeout=5.0, raft_max_timeout=5.01)
    try:
        rest = log.rest
        assert rest is not None and rest.enabled
        rest.resting = True  # as if it rested: waking restores the 5 s election timeout
        rest.wake("test")
        left = log._sync._SyncObj__raftElectionDeadline - raft_clock()
        assert 4.9 < left <= 5.01, left
    finally:
        log.close()


def test_a_cell_after_the_leader_of_a_resting_group_hung(group: ReplicaGroup):
    """A hung-but-alive leader (SIGSTOP: its sockets stay open) of a resting group: the
    followers rest with a long election timeout (75-90 s, kernel/raft_rest.py), so the next
    cell's own proposals must wake them (a follower forwards them to the leader, which changes
    nothing in its own log): woken, they elect within the normal timeout."""
    import os
    import signal

    group.execute("v = 3", target=1)
    status = group.wait_status(all_resting, timeout=30)
    leader = status[2]["raft_leader"]
    hung = next(rid for rid, r in group.replicas.items() if r.raft_address == leader)
    survivors = [rid for rid in group.replicas if rid != hung]
    pid = group.replicas[hung].proc.pid
    os.killpg(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        result = group.execute("print(v * 2)", target=survivors[0], to=survivors, timeout=60)
        took = time.monotonic() - t0
    finally:
        os.killpg(pid, signal.SIGCONT)
    assert result.executor() == survivors[0] and result.stdout() == "6\n", result.summary()
    assert took < 10.0, f"the cell took {took:.1f} s"
