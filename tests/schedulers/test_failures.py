"""SIGKILL of a replica, of a Local Scheduler, and of the Global Scheduler (then a restart): each
time the same kernel goes on with its variables (real daemons and replicas on loopback)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from sched_cluster import (  # noqa: F401 - fixture
    cluster_with_kernel,
    ls_gpus_committed,
    make_cluster_fixture,
    result_text,
    run_cell,
    run_seen,
    stream_text,
    wait_started,
)

from notebookos.ports import allocation_range, raft_port_range
from notebookos.proto import common_pb2
from notebookos.testing.processes import pid_alive

pytestmark = pytest.mark.timeout(180)


def _cluster_with_kernel(make_cluster, hosts: int = 4, env: dict | None = None,  # noqa: ANN001, ANN202
                         cell: str = "data = {'a': 1}\ndata['b'] = 2"):
    return cluster_with_kernel(make_cluster, hosts, env, cell)


# replicas whose Local Scheduler was killed wait this long for its restart
TAKEN_BACK = {"NOTEBOOKOS_LOCAL_SCHEDULER_ORPHAN_GRACE_S": "30"}


def _iopub_until_idle(kc, msg_id: str, timeout: float = 60) -> list[dict]:  # noqa: ANN001
    """The IOPub messages of the cell sent as ``msg_id``, up to its idle."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    while not any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                  for m in seen):
        assert time.monotonic() < deadline, f"no idle for the cell: {seen}"
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            seen.append(msg)
    return seen


def _replicas(cluster, kernel_id: str) -> dict[int, tuple[str, int]]:  # noqa: ANN001
    return {r.replica_id: (r.host_id, r.pid) for r in cluster.kernel(kernel_id).replicas}


def test_a_killed_replica_is_replaced_and_the_kernel_keeps_its_variables(make_cluster):
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    before = _replicas(cluster, kernel_id)
    executor = cluster.kernel(kernel_id).executor_replica_id
    os.kill(before[executor][1], signal.SIGKILL)
    # The notebook carries on while the replacement starts.
    assert result_text(run_cell(kc, "sorted(data.items())")) == "[('a', 1), ('b', 2)]"
    cluster.wait(lambda: _recovered(cluster, kernel_id, before), 90, "a replacement replica")
    after = _replicas(cluster, kernel_id)
    assert len({host for host, _ in after.values()}) == 3
    assert max(after) > max(before)  # the replacement has a fresh replica id
    # Founders' Raft ports come from the range kept for them; the replacement's from its host,
    # which probed it (a port drawn blindly could be taken there, and the replacement died).
    ports = {r.replica_id: int(r.raft_address.rpartition(":")[2])
             for r in cluster.kernel(kernel_id).replicas}
    (low, high), (raft_low, raft_high) = allocation_range(), raft_port_range()
    assert all(raft_low <= ports[rid] < raft_high for rid in before if rid in ports), ports
    assert low <= ports[max(after)] < high, ports
    assert result_text(run_cell(kc, "data['d'] = 4\nsorted(data.items())")) == (
        "[('a', 1), ('b', 2), ('d', 4)]")


def _recovered(cluster, kernel_id: str, before: dict) -> bool:  # noqa: ANN001
    """Three live replicas (none of them lost), all running, and the kernel no longer degraded."""
    status = cluster.kernel(kernel_id)
    live = [r for r in status.replicas if r.pid > 0]
    return len(live) == 3 and status.state in (2, 3)  # KERNEL_STATE_IDLE / BUSY


def test_killing_the_executor_mid_cell_fails_that_cell_once_and_the_kernel_goes_on(
        make_cluster):  # noqa: ANN001
    """The standbys abort the cell (its effects die with the executor) and the client gets
    NotebookOSExecutorFailed, not a rerun; the next cell runs on a survivor with the state
    before the failed cell."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    msg_id = kc.execute("import time\ndata['z'] = 26\ntime.sleep(60)")
    wait_started(kc, msg_id)
    # The replica running it (usually the previous cell's executor, but not always: the
    # test once killed that one while another ran the cell, which then finished "ok").
    running = [r for r in cluster.kernel(kernel_id).replicas
               if r.state == common_pb2.REPLICA_STATE_EXECUTING]
    assert len(running) == 1, cluster.kernel(kernel_id)
    os.kill(running[0].pid, signal.SIGKILL)
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "NotebookOSExecutorFailed", reply["content"]
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b']"


def test_a_cell_whose_replicas_all_die_mid_run_is_not_run_again(make_cluster, tmp_path):  # noqa: ANN001
    """Every replica SIGKILLed while the cell runs: the kernel is rebuilt from its checkpoint,
    and the cell, which may have run in part, fails with NotebookOSReplicasLost instead of
    being resubmitted to the rebuilt group (it ran twice, unannounced: found by the replay)."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    _wait_checkpointed(kc, run_cell(kc, "pass")["reply"]["content"]["execution_count"])
    runs = tmp_path / "runs"
    msg_id = kc.execute(f"import time\nwith open({str(runs)!r}, 'a') as f:\n    f.write('x')\n"
                        "time.sleep(60)")
    wait_started(kc, msg_id)
    # Killed once the cell has written its mark (killed between execute_input and the write,
    # the file was once found empty: a race of the test, not a second run).
    cluster.wait(lambda: runs.exists() and runs.read_text() == "x", 30, "the cell's mark")
    before = _replicas(cluster, kernel_id)
    for _, pid in before.values():
        os.kill(pid, signal.SIGKILL)
    reply = kc.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "NotebookOSReplicasLost", reply["content"]
    cluster.wait(lambda: not set(_replicas(cluster, kernel_id)) & set(before)
                 and _recovered(cluster, kernel_id, before), 120, "a rebuilt group")
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b']"
    time.sleep(2)
    assert runs.read_text() == "x", (f"the cell ran again ({runs.read_text()!r}); replicas "
                                     f"killed: {before}\n{cluster.log('gs')}")


def test_replicas_exiting_on_a_shutdown_request_are_not_failures(make_cluster):  # noqa: ANN001
    """A client's shutdown_request (Jupyter's shutdown, before its StopKernel) makes the
    replicas exit: the kernel is stopping, so no replacement starts and no rebuild from the
    checkpoint (every notebook closed paid for one, found by the replay), and its replicas
    show as stopped at once, so Jupyter's shutdown does not wait out its timeout."""
    from notebookos.proto import common_pb2

    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    before = _replicas(cluster, kernel_id)
    kc.shutdown()  # what jupyter_client's shutdown_kernel sends first
    cluster.wait(lambda: not any(pid_alive(pid) for _, pid in before.values()), 60,
                 "the replicas exit")
    cluster.wait(lambda: all(r.state == common_pb2.REPLICA_STATE_STOPPED
                             for r in cluster.kernel(kernel_id).replicas), 10,
                 "the replicas reported stopped")
    time.sleep(3)  # a replacement or a rebuild would have started by now
    status = cluster.kernel(kernel_id)
    assert status.state == common_pb2.KERNEL_STATE_STOPPING, status
    assert {r.replica_id for r in status.replicas} == set(before), status
    assert "checkpoint" not in status.message, status.message


def test_a_killed_local_scheduler_means_its_replicas_are_replaced(make_cluster):
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    before = _replicas(cluster, kernel_id)
    victim_host, victim_pid = before[min(before)]
    cluster.ls[victim_host].send_signal(signal.SIGKILL)
    cluster.wait(lambda: all(h != victim_host for h, _ in _replicas(cluster, kernel_id).values())
                 and _recovered(cluster, kernel_id, before), 90, "replicas off the dead host")
    assert victim_host not in {h.host_id for h in cluster.status().hosts}
    # no Local Scheduler took it back within its grace (3 s here): it ends itself
    cluster.wait(lambda: not pid_alive(victim_pid), 15, "the orphaned replica to end")
    assert result_text(run_cell(kc, "data['c'] = 3\nsorted(data)")) == "['a', 'b', 'c']"


def test_a_restarted_local_scheduler_takes_its_replicas_back(make_cluster):  # noqa: ANN001
    """Issue 33: a Local Scheduler SIGKILLed and started again (as `notebookos up` does) loses no
    replica: they outlive it, the new daemon finds them in its records, registers with them, and
    the Global Scheduler keeps them. It also watches them again: a later death is reported."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, 3, TAKEN_BACK, "data = {'a': 1}")
    before = _replicas(cluster, kernel_id)
    count = 1
    for victim_host, victim_pid in before.values():
        old_address = next(h.address for h in cluster.status().hosts if h.host_id == victim_host)
        cluster.ls[victim_host].send_signal(signal.SIGKILL)
        cluster.ls[victim_host].wait(timeout=10)
        cluster.start_ls(victim_host)
        cluster.wait(lambda h=victim_host, a=old_address: any(
            x.host_id == h and x.address != a for x in cluster.status().hosts), 30,
            "the restarted Local Scheduler to register")
        assert _replicas(cluster, kernel_id) == before, "a replica was lost or replaced"
        assert pid_alive(victim_pid)
        count += 1
        assert result_text(run_cell(kc, "data[len(data)] = 1\nlen(data)")) == str(count)
    assert "lost" not in cluster.log("gs"), cluster.log("gs")
    # every replica was taken back; the cells ran on them (the GPUs were committed on hosts
    # whose daemon had restarted) and the kernel never ran on fewer than three
    victim_host, victim_pid = before[min(before)]
    os.kill(victim_pid, signal.SIGKILL)  # watched by the new daemon: reported, replaced
    cluster.wait(lambda: _replicas(cluster, kernel_id).get(min(before)) != (victim_host,
                 victim_pid) and _recovered(cluster, kernel_id, before), 60,
                 "the replica's death to be seen and the replica replaced")
    assert result_text(run_cell(kc, "len(data)")) == "4"


def test_a_restarted_global_scheduler_rebinds_the_front_and_the_kernel_carries_on(make_cluster):
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=3)
    ports = cluster.kernel(kernel_id).connection
    replicas = _replicas(cluster, kernel_id)
    running = kc.execute("import time; time.sleep(3)")  # mid-cell when the GS dies
    cluster.wait(lambda: cluster.status().gpus_committed == 1, 20, "the cell running")
    addresses = [h.address for h in cluster.status().hosts]
    cluster.gs.send_signal(signal.SIGKILL)
    cluster.gs.wait(10)
    restarted = time.time()
    cluster.start_gs()
    cluster.wait_hosts(3)
    # The new instance does not know that request: the GPU is released (reconciled from the
    # Local Schedulers' heartbeats) instead of staying committed forever.
    cluster.wait(lambda: sum(ls_gpus_committed(a) for a in addresses) == 0, 20,
                 "the orphaned GPU released")
    # ...and the cell that ran across the restart still gets its reply (its outputs may be lost).
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == running
    assert reply["content"]["status"] == "ok"
    status = cluster.kernel(kernel_id)
    names = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    assert [getattr(status.connection, n) for n in names] == [getattr(ports, n) for n in names]
    assert _replicas(cluster, kernel_id) == replicas
    # The same client, connected to the same ports, goes on with the same namespace.
    assert result_text(run_cell(kc, "sorted(data.values())")) == "[1, 2]"
    # Every Local Scheduler talks to the new instance (heartbeats accepted, or registered again).
    cluster.wait(lambda: all(h.last_heartbeat_unix > restarted for h in cluster.status().hosts),
                 20, "Local Schedulers heartbeating to the new instance")
    assert _replicas(cluster, kernel_id) == replicas


LINES = 25
PRINTING_CELL = (
    "import time\nprint('a', flush=True)\n"
    f"for i in range({LINES}):\n    time.sleep(0.2)\n    print(i, flush=True)\n"
)


def test_output_printed_while_the_global_scheduler_restarts_is_not_lost(make_cluster):
    """The replicas hold IOPub while no Global Scheduler subscribes and the new front holds it
    until the client resubscribes: every line arrives, in order, with one busy and one idle."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=3)
    msg_id = kc.execute(PRINTING_CELL)
    text, statuses = "", []

    def collect(until) -> None:  # noqa: ANN001
        nonlocal text
        deadline = time.monotonic() + 60
        while not until():
            assert time.monotonic() < deadline, f"iopub so far: {text!r} {statuses}"
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:  # noqa: BLE001 - queue.Empty: keep waiting
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "status":
                statuses.append(msg["content"]["execution_state"])

    collect(lambda: "\n1\n" in text)  # mid-cell
    cluster.gs.send_signal(signal.SIGKILL)
    cluster.gs.wait(10)
    cluster.start_gs()
    collect(lambda: "idle" in statuses)
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok"
    assert text == "a\n" + "".join(f"{i}\n" for i in range(LINES))
    time.sleep(1)  # a second idle (a standby's) would arrive by now
    collect(lambda: True)
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=0.5)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing more
            break
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
            statuses.append(msg["content"]["execution_state"])
    assert statuses == ["busy", "idle"]
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b']"


def test_a_cell_that_finishes_while_the_global_scheduler_is_down_still_gets_its_reply(
        make_cluster):  # noqa: ANN001
    """The executor's reply finds no scheduler: the replica keeps it and sends it to the
    restarted front, which forwards it to the client's session; output and idle arrive too."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=3)
    msg_id = kc.execute("import time\ntime.sleep(1)\ndata['c'] = 3\n'finished'")
    deadline = time.monotonic() + 30
    while True:  # the cell runs: its execute_input went out
        assert time.monotonic() < deadline, "the cell never started"
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            break
    cluster.gs.send_signal(signal.SIGKILL)
    cluster.gs.wait(10)
    time.sleep(3)  # the cell finishes, and replies, while no Global Scheduler runs
    cluster.start_gs()
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok"
    results, idle = [], False
    deadline = time.monotonic() + 30
    while not idle:
        assert time.monotonic() < deadline, f"no idle (results so far: {results})"
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "execute_result":
            results.append(msg["content"]["data"]["text/plain"])
        idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
    assert results == ["'finished'"]
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b', 'c']"


def _wait_checkpointed(kc, execution_count: int, timeout: float = 20) -> None:  # noqa: ANN001
    """Until the group's store checkpoint covers ``execution_count`` (it is written after the
    cell's Completion commits, off the cell's critical path: ``idle`` does not wait for it)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        request = kc.session.msg("replica_status_request", {})
        kc.control_channel.send(request)
        reply = kc.get_control_msg(timeout=10)
        if reply["parent_header"].get("msg_id") != request["header"]["msg_id"]:
            continue
        seen = reply["content"].get("checkpoint_count")
        if seen is not None and seen >= execution_count:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of cell {execution_count} (last seen: {seen})")


def test_losing_the_majority_rebuilds_the_kernel_from_its_last_checkpoint(make_cluster):
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    cell = run_cell(kc, "data['e'] = 5")
    assert cell["reply"]["content"]["status"] == "ok"
    _wait_checkpointed(kc, cell["reply"]["content"]["execution_count"])
    before = _replicas(cluster, kernel_id)
    for rid in sorted(before)[:2]:
        os.kill(before[rid][1], signal.SIGKILL)
    cluster.wait(lambda: not set(_replicas(cluster, kernel_id)) & set(before)
                 and _recovered(cluster, kernel_id, before), 120, "a rebuilt group")
    status = cluster.kernel(kernel_id)
    assert "checkpoint" in status.message
    assert not pid_alive(before[max(before)][1])  # the survivor was stopped, not left diverging
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b', 'e']"


def test_a_cell_sent_while_every_replica_is_being_replaced_waits_and_runs(make_cluster):  # noqa: ANN001
    """Every replica of an idle kernel SIGKILLed, and a cell sent while none is connected: it
    waits for the rebuilt group (told why on stderr) and runs there, instead of the error
    "no live replica, retry shortly" it got before (found by a user trial: a Global Scheduler
    restart that left the kernel without replicas)."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    _wait_checkpointed(kc, run_cell(kc, "pass")["reply"]["content"]["execution_count"])
    before = _replicas(cluster, kernel_id)
    for _, pid in before.values():
        os.kill(pid, signal.SIGKILL)
    cluster.wait(lambda: not cluster.kernel(kernel_id).replicas, 30, "every replica dropped")
    run = run_seen(kc, "sorted(data)", timeout=120)
    assert run["reply"]["content"]["status"] == "ok", run["reply"]["content"]
    results = [m["content"]["data"]["text/plain"] for m in run["iopub"]
               if m["msg_type"] == "execute_result"]
    assert results == ["['a', 'b']"]
    assert "waiting for the kernel's replicas" in stream_text(run, "stderr")
    assert not set(_replicas(cluster, kernel_id)) & set(before)


def test_replacements_joining_a_rebuilt_group_hold_the_checkpoint_too(make_cluster):
    """After a rebuild the group's log starts at the checkpoint: a replacement that joins later
    must load it, or what no later cell re-bound (here an imported module) is missing on it, and
    a cell it runs fails with a NameError (found by benchmarks/chaos.py)."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    cell = run_cell(kc, "import json as codec\ndata['e'] = 5")
    assert cell["reply"]["content"]["status"] == "ok"
    _wait_checkpointed(kc, cell["reply"]["content"]["execution_count"])
    before = _replicas(cluster, kernel_id)
    for rid in sorted(before)[:2]:
        os.kill(before[rid][1], signal.SIGKILL)
    cluster.wait(lambda: not set(_replicas(cluster, kernel_id)) & set(before)
                 and _recovered(cluster, kernel_id, before), 120, "a rebuilt group")
    assert run_cell(kc, "data['f'] = 6")["reply"]["content"]["status"] == "ok"
    # Replace every founder of the rebuilt group, one at a time: then a joiner runs the cell.
    founders = _replicas(cluster, kernel_id)
    for rid in sorted(founders):
        current = _replicas(cluster, kernel_id)
        os.kill(current[rid][1], signal.SIGKILL)
        cluster.wait(lambda rid=rid, current=current: rid not in _replicas(cluster, kernel_id)
                     and _recovered(cluster, kernel_id, current), 120, f"replica {rid} replaced")
    assert not set(_replicas(cluster, kernel_id)) & set(founders)
    run = run_cell(kc, "codec.dumps(sorted(data))")
    assert run["reply"]["content"]["status"] == "ok", run
    assert result_text(run) == """'["a", "b", "e", "f"]'"""


def _session_holder(cluster, kernel_id: str) -> tuple[int, str]:  # noqa: ANN001
    """(replica id, host) of the reservation kernel's single replica, once it is running."""
    (replica,) = cluster.kernel(kernel_id).replicas
    return replica.replica_id, replica.host_id


def _committed_by_host(cluster) -> dict[str, int]:  # noqa: ANN001
    """GPUs committed per host as ``notebookos status --json`` shows them."""
    out = subprocess.run([sys.executable, "-m", "notebookos.cli", "status", "--json",
                          "--global-scheduler", cluster.gs_address],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return {h["id"]: h["gpus"]["committed"] for h in json.loads(out)["hosts"]}


def _assigned_gpus(kc) -> list[int]:  # noqa: ANN001
    run = run_cell(kc, "from notebookos.kernel.gpu_binding import assigned_gpus\n"
                       "list(assigned_gpus())")
    assert run["reply"]["content"]["status"] == "ok", run
    return json.loads(result_text(run))


def test_a_reservation_kernels_replacement_gets_the_session_gpus(make_cluster):
    """Reservation binds the kernel's GPUs at start; when its replica is lost (SIGKILL, then
    its Local Scheduler) the rebuilt replica commits them on its own host, as the container
    cycle decides (``SESSION_GPUS``, recorded: the Global Scheduler's debug log of
    ``_record_cycle``)."""
    cluster = make_cluster()
    cluster.start_gs("--policy", "reservation", "--log-level", "DEBUG")
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=1)
    cluster.wait_hosts(3)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert run_cell(kc, "x = 7")["reply"]["content"]["status"] == "ok"
    rid, host = _session_holder(cluster, kernel_id)
    assert _committed_by_host(cluster) == {f"host-{i}": int(f"host-{i}" == host)
                                           for i in range(3)}
    assert len(_assigned_gpus(kc)) == 1

    def moved(old_rid: int) -> bool:
        status = cluster.kernel(kernel_id)
        return (len(status.replicas) == 1 and status.replicas[0].replica_id != old_rid
                and status.replicas[0].pid > 0 and status.state in (2, 3))

    def check_bound(lost_host: str | None) -> str:
        new_rid, new_host = _session_holder(cluster, kernel_id)
        committed = _committed_by_host(cluster)
        assert committed[new_host] == 1, committed
        assert sum(committed.values()) == 1, committed
        addresses = {h.host_id: h.address for h in cluster.status().hosts}
        assert ls_gpus_committed(addresses[new_host]) == 1
        if lost_host is not None and lost_host != new_host and lost_host in addresses:
            assert ls_gpus_committed(addresses[lost_host]) == 0
        assert len(_assigned_gpus(kc)) == 1  # the next cell runs with its GPU
        gs_log = (cluster.workdir / "gs.log").read_text(errors="replace")
        rebinds = re.findall(rf"kernel {kernel_id}: session_gpus cycle (\w+) (\w+) on "
                             r"\('([\w-]+)',\)", gs_log)
        assert rebinds and rebinds[-1] == ("success", "reserve", new_host), rebinds
        return new_host

    os.kill(_replicas(cluster, kernel_id)[rid][1], signal.SIGKILL)
    cluster.wait(lambda: moved(rid), 120, "the rebuilt replica")
    host = check_bound(host)
    assert result_text(run_cell(kc, "x")) == "7"  # from the checkpoint

    rid, _ = _session_holder(cluster, kernel_id)
    cluster.ls[host].send_signal(signal.SIGKILL)
    cluster.wait(lambda: moved(rid) and _session_holder(cluster, kernel_id)[1] != host, 120,
                 "a replica on another host")
    check_bound(None)
    assert result_text(run_cell(kc, "x")) == "7"


def test_a_cell_whose_first_election_fails_keeps_its_output_and_its_idle_comes_last(
        make_cluster):  # noqa: ANN001
    """The replica chosen to run a cell proposes too late (here: stopped; in the fault campaign:
    still applying the previous cell's large objects), so the election fails and the front runs
    the cell again under a new id. That replica's busy/idle for the failed attempt must not
    reach the client as the cell's end: the client stopped reading at that idle and lost the
    output of the run that followed (and, the executor killed right after, its state)."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    executor = cluster.kernel(kernel_id).executor_replica_id  # the next cell sticks to it
    pid = _replicas(cluster, kernel_id)[executor][1]
    os.kill(pid, signal.SIGSTOP)
    try:
        msg_id = kc.execute("import time\ntime.sleep(1)\nprint('ran', sorted(data))")
        time.sleep(3)  # the standbys' election fails without the executor's LEAD
    finally:
        os.kill(pid, signal.SIGCONT)
    seen = _iopub_until_idle(kc, msg_id)
    out = "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream")
    assert out == "ran ['a', 'b']\n", [(m["msg_type"], m["content"]) for m in seen]
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok", reply["content"]
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b']"


def test_an_executor_lost_between_its_reply_and_its_idle_is_announced(make_cluster):  # noqa: ANN001
    """The executor answers a cell, then dies while it replicates what the cell changed: its
    idle never comes, so the front sends one (the notebook must not stay busy) with a warning
    that the cell's changes may be lost."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    executor = cluster.kernel(kernel_id).executor_replica_id
    pid = _replicas(cluster, kernel_id)[executor][1]
    # A large object makes the replication after the reply take a while.
    msg_id = kc.execute("import numpy as np\nbig = np.random.rand(4 << 20)\nprint('done')")
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    os.kill(pid, signal.SIGKILL)
    seen = _iopub_until_idle(kc, msg_id)
    err = "".join(m["content"]["text"] for m in seen
                  if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
    assert "was lost before what the cell changed was replicated" in err \
        or not err, err  # the idle may have come before the kill: then no warning
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b']"


def _replica_endpoints(cluster, kernel_id: str) -> dict[int, dict]:  # noqa: ANN001
    """The replicas' sockets as the Global Scheduler's registry journal last recorded them."""
    journal = cluster.workdir / "state" / "global_scheduler" / "registry.json.journal"
    doc = None
    for line in journal.read_text().splitlines():
        change = json.loads(line)
        if change.get("table") == "kernels" and change.get("id") == kernel_id and change.get(
                "doc"):
            doc = change["doc"]
    assert doc is not None, "the kernel is not in the registry journal"
    return {r["replica_id"]: {**r, "key": doc["key"], "scheme": doc["signature_scheme"]}
            for r in doc["replicas"]}


def test_a_group_that_counts_a_gone_member_is_rebuilt_instead_of_hanging(make_cluster):  # noqa: ANN001
    """The Raft group holds a member the Global Scheduler does not know (as a membership change
    it took for done and a new leader rolled back left one; here added behind its back at an
    address nobody listens on): after the executor's kill two of its four members live, so
    nothing commits. The scheduler used to retry removing the dead executor for good
    (NotebookOSMembershipChangeFailed every 20 s) while every cell hung without a reply or an
    idle (issue 31, items 4 and 8). It sees that no live member has a quorum and rebuilds the
    group from the last checkpoint; the cell runs there."""
    from notebookos.global_scheduler.control import control_request
    from notebookos.global_scheduler.front import ReplicaEndpoint
    from notebookos.testing.processes import free_port

    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    cell = run_cell(kc, "data['c'] = 3")
    _wait_checkpointed(kc, cell["reply"]["content"]["execution_count"])
    executor = cluster.kernel(kernel_id).executor_replica_id
    endpoints = _replica_endpoints(cluster, kernel_id)
    via = endpoints[min(set(endpoints) - {executor})]
    control_request(
        ReplicaEndpoint(via["replica_id"], via["ip"], via["shell_port"], via["iopub_port"],
                        via["stdin_port"], via["control_port"]),
        via["key"], via["scheme"], "add_replica_request",
        {"replica_id": 99, "raft_address": f"127.0.0.1:{free_port()}"}, timeout_s=30)
    os.kill(_replicas(cluster, kernel_id)[executor][1], signal.SIGKILL)
    started = time.monotonic()
    run = run_cell(kc, "sorted(data)", timeout=60)
    assert run["reply"]["content"]["status"] == "ok", run["reply"]["content"]
    assert result_text(run) == "['a', 'b', 'c']", run["outputs"]
    assert time.monotonic() - started < 45


def test_the_executor_killed_after_every_cell_never_wedges_the_kernel(make_cluster):  # noqa: ANN001
    """Issue 31, item 4: ``x += 1; print(x)``, the executor SIGKILLed as soon as the cell is
    done and the next cell sent at once, several times running (each kill lands while the
    previous one's replacement may still be joining). Every cell must answer, reply and idle,
    with the count it should print, or say that the kernel was rebuilt from a checkpoint."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster)
    assert run_cell(kc, "x = 0")["reply"]["content"]["status"] == "ok"
    expected = 0
    for _ in range(5):
        run = run_cell(kc, "x += 1\nprint(x)", timeout=45)  # raises on no reply or no idle
        assert run["reply"]["content"]["status"] == "ok", run["reply"]["content"]
        assert run["statuses"][-1:] == ["idle"], run["statuses"]
        text = "".join(m["content"]["text"] for m in run["outputs"]
                       if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
        expected += 1
        # a rebuild says so: from the store's checkpoint, or from what a survivor held
        if "was rebuilt from the" not in json.dumps([m["content"] for m in run["outputs"]]):
            assert text == f"{expected}\n", (text, run["outputs"])
        expected = int(text.strip().splitlines()[-1])
        status = cluster.kernel(kernel_id)
        pid = {r.replica_id: r.pid for r in status.replicas}.get(status.executor_replica_id, 0)
        if pid > 0:
            os.kill(pid, signal.SIGKILL)
    run = run_cell(kc, "print(x)", timeout=45)
    assert run["reply"]["content"]["status"] == "ok", run["reply"]["content"]


def test_a_local_scheduler_that_stops_answering_shows_in_the_status_within_a_second(
        make_cluster) -> None:  # noqa: ANN001
    """Issue 33 item 2: the status never shows a stale view. A SIGKILLed Local Scheduler is
    seen at once (its connection closes and reconnecting is refused), long before the heartbeat
    timeout: the host says since when, and each kernel with a replica there says its daemon
    does not answer while the replica runs on. A restarted daemon clears both."""
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_HEARTBEAT_TIMEOUT_S": "30",
                            "NOTEBOOKOS_LOCAL_SCHEDULER_ORPHAN_GRACE_S": "30"})
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"u-host-{i}")
    cluster.wait_hosts(3)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert run_cell(kc, "data = {'a': 1}")["reply"]["content"]["status"] == "ok"
    victim_host, victim_pid = _replicas(cluster, kernel_id)[1]
    killed = time.monotonic()
    cluster.ls[victim_host].send_signal(signal.SIGKILL)
    cluster.wait(lambda: "does not answer" in cluster.kernel(kernel_id).message, 5,
                 "the kernel's status to say its host's daemon does not answer")
    seen_after = time.monotonic() - killed
    assert seen_after < 2.0, f"seen after {seen_after:.2f} s"  # the issue asks 1 s; load
    message = cluster.kernel(kernel_id).message
    assert f"the Local Scheduler of host {victim_host} does not answer" in message, message
    host = next(h for h in cluster.status().hosts if h.host_id == victim_host)
    assert host.unreachable_since_unix > 0
    assert pid_alive(victim_pid)  # the replica runs on
    cluster.ls[victim_host].wait(timeout=10)
    cluster.start_ls(victim_host)
    cluster.wait(lambda: "does not answer" not in cluster.kernel(kernel_id).message, 30,
                 "the restarted daemon to clear it")
    assert all(h.unreachable_since_unix == 0 for h in cluster.status().hosts)
    assert result_text(run_cell(kc, "data['b'] = 2\nsorted(data)")) == "['a', 'b']"


def test_a_replica_that_dies_while_its_local_scheduler_is_down_is_replaced(make_cluster):  # noqa: ANN001
    """Issue 33: nobody watches a replica while its Local Scheduler is down; the restarted daemon
    finds it gone among its records, and the Global Scheduler replaces it (no stale status, no
    replica counted that does not run), with the kernel's variables kept."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, 4, TAKEN_BACK, "data = {'a': 1}")
    before = _replicas(cluster, kernel_id)
    victim_id = max(before)
    victim_host, victim_pid = before[victim_id]
    cluster.ls[victim_host].send_signal(signal.SIGKILL)
    cluster.ls[victim_host].wait(timeout=10)
    os.kill(victim_pid, signal.SIGKILL)
    cluster.start_ls(victim_host)
    cluster.wait(lambda: victim_id not in _replicas(cluster, kernel_id)
                 and _recovered(cluster, kernel_id, before), 90,
                 "the replica that died unwatched to be replaced")
    assert all(pid_alive(pid) for _, pid in _replicas(cluster, kernel_id).values())
    assert result_text(run_cell(kc, "data['b'] = 2\nsorted(data)")) == "['a', 'b']"
