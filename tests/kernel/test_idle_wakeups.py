"""Issue 36: an idle replica wakes no more than a plain ipykernel does.

Every wake-up of an idle process costs CPU (about 0.05-0.5 ms each on the 2-core VM), and a
notebook is three replicas. What an idle replica had beyond a plain kernel, found by counting
``voluntary_ctxt_switches`` per thread over 10 s and ``strace -f`` (docs/performance.md):

- the Raft tick thread: a 3 s tick while resting and a heartbeat every 4-7 s (about 0.35 wake-ups
  a second per replica); now it sleeps until a message or its next duty (kernel/raft_rest.py);
- libzmq's IO thread: ZMTP heartbeats on the IOPub socket every 2 s (0.8-1 a second); now the
  operating system's TCP keepalive finds a vanished subscriber (kernel/iopub.py);
- the main thread: the apply loop's 5 s safety timeout (0.2 a second); now 60 s.

HOLDS THE RESULT: the old code woke each idle replica about 1.4 times a second beyond the
heartbeat pings this harness's clients send (8-9 a replica in the 6 s window, 25 for the
group); the bound below allows a rest heartbeat in the window and ipykernel's own IOPub timer.
"""

from __future__ import annotations

import os
import time

from harness import ReplicaGroup

WINDOW_S = 6.0
GROUP_BOUND = 12  # wake-ups of the three replicas together in WINDOW_S (the old code: ~25)


def _wakeups(pid: int) -> dict[int, int]:
    counts = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:  # a thread that ended
            continue
        counts[int(tid)] = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return counts


def all_resting(status: dict[int, dict]) -> bool:
    return all(s.get("raft_resting") for s in status.values())


def test_an_idle_replica_group_stays_asleep(group: ReplicaGroup) -> None:
    group.execute("x = 1", target=1)
    group.wait_status(all_resting, timeout=30)
    for replica in group.replicas.values():  # the harness's heartbeat pings wake every kernel
        assert replica.client is not None
        replica.client.hb_channel.stop()
    time.sleep(1.5)  # the last status request and the pings settle
    pids = {rid: r.proc.pid for rid, r in group.replicas.items()}
    before = {rid: _wakeups(pid) for rid, pid in pids.items()}
    time.sleep(WINDOW_S)
    after = {rid: _wakeups(pid) for rid, pid in pids.items()}
    per_thread = {
        rid: {tid: n - before[rid].get(tid, 0) for tid, n in after[rid].items()
              if n - before[rid].get(tid, 0)}
        for rid in pids
    }
    total = sum(sum(threads.values()) for threads in per_thread.values())
    assert total <= GROUP_BOUND, f"{total} wake-ups in {WINDOW_S:g} s: {per_thread}"


def test_a_sticky_cell_wakes_the_executors_loop_once_by_commit(group: ReplicaGroup) -> None:
    """A cell on the replica that ran the previous one: its LEAD's commit wakes the kernel's
    loop (the cell waits for it), its Completion's does not (``_sync_after_cell`` learns of it
    from its own callback). The code before woke it for both: the wait for the executor's
    turn, and the wait for the decision, left commits watched after their last look (issue
    36: a needless hand-off to the loop per cell, two busy cores)."""
    group.execute("x = 1", target=1)
    group.wait_status(lambda s: all(r["open_elections"] == 0 for r in s.values()), timeout=30)
    time.sleep(2.5)  # the unchanged cells' checkpoint (due 2 s after one) is written first
    before = group.status()[1]["commit_wakes"]
    cells = 10
    for _ in range(cells):
        result = group.execute("1+1", target=1, to=[1])  # as the scheduler sends a sticky cell
        assert result.replies[1]["content"]["status"] == "ok"
    woken = group.status()[1]["commit_wakes"] - before
    # one per cell, and room for one checkpoint's record
    assert woken <= cells + 1, f"{woken} wake-ups by commits for {cells} cells"
