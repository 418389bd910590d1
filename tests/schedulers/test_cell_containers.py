"""Per-cell containers (``batch``, ``lcp``) in the live schedulers: a kernel is parked between
cells (no replica process), each cell runs in its own container restored from the store
checkpoint, batch serves the cell queue first-come first-served, lcp takes warm processes from the
host's pool, and a parked kernel still answers the requests a notebook UI sends."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psutil
import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

from notebookos.commands.status_cmd import render_text, status_document
from notebookos.proto import common_pb2, global_scheduler_pb2

pytestmark = pytest.mark.timeout(150)

PARKED = common_pb2.KERNEL_STATE_PARKED


def wait_parked(cluster, kernel_id: str, timeout: float = 30) -> common_pb2.KernelStatus:
    cluster.wait(lambda: cluster.kernel(kernel_id).state == PARKED
                 and not cluster.kernel(kernel_id).replicas, timeout, f"{kernel_id} parked")
    return cluster.kernel(kernel_id)


def parked_batch_kernel(make_cluster):  # noqa: ANN001, ANN201
    """A batch-policy cluster of one 1-GPU host and a 1-GPU kernel, parked."""
    cluster = make_cluster()
    cluster.start_gs("--policy", "batch")
    cluster.start_ls("host-0", gpus=1)
    cluster.wait_hosts(1)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    wait_parked(cluster, kernel_id)
    return cluster, kernel_id, kc


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def pool_pids(ls_pid: int) -> set[int]:
    """The prewarmed processes waiting in a Local Scheduler's pool: its children that run
    ``prewarm_main``, and those its fork server forked (the usual kind). A promoted one stays
    where it was, so only those not yet promoted are told apart by the caller; here, with every
    replica parked between cells, the fork server's children are the pool's."""
    pids = set()
    for child in psutil.Process(ls_pid).children():
        argv = " ".join(child.cmdline())
        if "notebookos.local_scheduler.prewarm_main" in argv:
            pids.add(child.pid)
        elif "notebookos.local_scheduler.fork_server_main" in argv:
            pids.update(p.pid for p in child.children())
    return pids


def test_batch_runs_each_cell_in_a_fresh_container_restored_from_the_checkpoint(make_cluster):
    cluster, kernel_id, kc = parked_batch_kernel(make_cluster)
    assert cluster.kernel(kernel_id).executor_replica_id == 0
    cells = [
        "a = bytes(8_000_000)  # large: goes to the store\nn = 20",  # a checkpoint to flush
        "b = n + 1\nlen(a)",
        "c = n * b\nc",
    ]
    pids = []
    results = []
    for code in cells:
        run = run_cell(kc, code)
        assert run["reply"]["content"]["status"] == "ok", run
        assert run["statuses"] == ["busy", "idle"]
        # the restore of a planned container start is silent
        assert not [m for m in run["outputs"] if m["msg_type"] == "stream"], run["outputs"]
        results.append(result_text(run) if code != cells[0] else "")
        status = wait_parked(cluster, kernel_id)
        assert status.last_cell_pid and not status.last_cell_from_prewarm_pool
        assert status.last_container_start_ms > 0
        assert status.last_interactivity_delay_ms >= status.last_container_start_ms
        pids.append(status.last_cell_pid)
        # no replica process is left between cells, and the host lists none
        cluster.wait(lambda: gone(pids[-1]), 10, f"container pid {pids[-1]} gone")
        host = cluster.status().hosts[0]
        assert host.gpus_committed == 0 and host.subscribed.gpus == 0
    assert results[1:] == ["8000000", "420"]
    assert len(set(pids)) == 3
    # `notebookos status` shows the parked kernel and its last cell's container start
    doc = status_document(cluster.status())
    (entry,) = doc["kernels"]
    assert entry["state"] == "parked" and entry["replicas"] == []
    assert entry["last_container_start_ms"] > 0
    assert "(parked)" in render_text(doc) and "container start" in render_text(doc)


def test_a_batch_kernels_first_container_host_comes_from_the_cycle(make_cluster):
    """The container that answers a per-cell kernel's first kernel_info is placed by the
    container cycle (``ANSWER_ONLY``) and the decision is recorded like the others (the
    Global Scheduler's debug log of ``_record_cycle``): here only host-1 can bind the kernel's
    2 GPUs, so the policy's host is host-1, and the container starts there."""
    cluster = make_cluster()
    cluster.start_gs("--policy", "batch", "--log-level", "DEBUG")
    cluster.start_ls("host-0", gpus=1)
    cluster.start_ls("host-1", gpus=2)
    cluster.wait_hosts(2)
    kernel_id, kc = cluster.start_kernel(gpus=2)
    wait_parked(cluster, kernel_id)
    gs_log = (cluster.workdir / "gs.log").read_text(errors="replace")
    decided = re.findall(rf"kernel {kernel_id}: first_container cycle success place on "
                         r"\('([\w-]+)',\)", gs_log)
    assert decided == ["host-1"], gs_log[-4000:]
    assert f"started replica {kernel_id}/" in (cluster.workdir / "host-1.log").read_text()
    assert kernel_id not in (cluster.workdir / "host-0.log").read_text()
    assert run_cell(kc, "1 + 1")["reply"]["content"]["status"] == "ok"


def test_a_silent_cells_changes_survive_its_container(make_cluster):
    """A silent cell takes no execution count, so the counts alone would call its container's
    checkpoint current before it is written; the container reports it pending instead."""
    cluster, kernel_id, kc = parked_batch_kernel(make_cluster)
    assert result_text(run_cell(kc, "seen = ['loud']\nlen(seen)")) == "1"
    wait_parked(cluster, kernel_id)
    for i in range(3):
        msg_id = kc.execute(f"seen.append('quiet {i}')", silent=True)
        reply = kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "ok", reply["content"]
        wait_parked(cluster, kernel_id)
    run = run_cell(kc, "seen")
    assert result_text(run) == "['loud', 'quiet 0', 'quiet 1', 'quiet 2']"
    assert run["reply"]["content"]["execution_count"] == 2
    assert not cluster.kernel(kernel_id).message, cluster.kernel(kernel_id).message


def test_lcp_cell_borrows_a_warm_process_and_the_pool_refills(make_cluster):
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_WARM_CONTAINERS_PER_HOST": "2"})
    cluster.start_gs("--policy", "lcp")
    ls = cluster.start_ls("host-0", gpus=1, prewarm=0)  # the GS sets the pool to the policy's 2
    cluster.wait_hosts(1)
    cluster.wait(lambda: cluster.status().hosts[0].prewarm_pool_size == 2, 60, "a warm pool of 2")
    kernel_id, kc = cluster.start_kernel(gpus=1)
    wait_parked(cluster, kernel_id)
    assert result_text(run_cell(kc, "x = 6 * 7\nx")) == "42"
    wait_parked(cluster, kernel_id)
    cluster.wait(lambda: len(pool_pids(ls.pid)) == 2
                 and cluster.status().hosts[0].prewarm_pool_size == 2, 60, "the pool refilled")
    warm = pool_pids(ls.pid)
    run = run_cell(kc, "x + 1")
    assert result_text(run) == "43"
    status = wait_parked(cluster, kernel_id)
    assert status.last_cell_from_prewarm_pool
    assert status.last_cell_pid in warm  # the cell ran in a process that waited in the pool
    cluster.wait(lambda: gone(status.last_cell_pid), 10, "the borrowed process stopped")
    # the pool refills with a fresh process, never the one that held the kernel's state
    cluster.wait(lambda: len(pool_pids(ls.pid)) == 2, 60, "the pool refilled again")
    refilled = pool_pids(ls.pid)
    assert status.last_cell_pid not in refilled and refilled - warm


def _timed_cell(cluster, kc, seconds: float, out: dict, name: str) -> None:
    run = run_cell(kc, f"import time\nt0 = time.time()\ntime.sleep({seconds})\nt0", timeout=90)
    out[name] = (run["reply"]["content"], float(result_text(run))
                 if run["reply"]["content"]["status"] == "ok" else None, time.time())


@pytest.mark.parametrize("policy", ["batch", "lcp"])
def test_cell_queue_order(make_cluster, policy):
    """A holds 1 of 2 GPUs; B asks for 2 (blocked), then C for 1 (fits now). batch serves the
    queue first-come first-served, so C waits behind B; lcp backfills, so C starts at once."""
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_WARM_CONTAINERS_PER_HOST": "1"})
    cluster.start_gs("--policy", policy)
    cluster.start_ls("host-0", gpus=2)
    cluster.wait_hosts(1)
    a_id, a = cluster.start_kernel(gpus=1)
    b_id, b = cluster.start_kernel(gpus=2)
    c_id, c = cluster.start_kernel(gpus=1)
    for kid in (a_id, b_id, c_id):
        wait_parked(cluster, kid)
    out: dict = {}
    threads = [threading.Thread(target=_timed_cell, args=(cluster, a, 4, out, "a"))]
    threads[0].start()
    cluster.wait(lambda: cluster.status().gpus_committed == 1, 30, "A's cell running")
    threads.append(threading.Thread(target=_timed_cell, args=(cluster, b, 1, out, "b")))
    threads[1].start()
    cluster.wait(lambda: cluster.kernel(b_id).queued_cells == 1, 10, "B's cell queued")
    threads.append(threading.Thread(target=_timed_cell, args=(cluster, c, 1, out, "c")))
    threads[2].start()
    for t in threads:
        t.join(timeout=120)
    assert all(out[k][0]["status"] == "ok" for k in "abc"), out
    a_end, b_start, c_start = out["a"][2], out["b"][1], out["c"][1]
    if policy == "batch":
        assert b_start >= a_end - 0.5, out  # B needs both GPUs: after A
        assert c_start >= b_start, out  # C arrived after B and may not overtake it
    else:
        assert c_start < a_end - 1.0, out  # C fitted next to A and went ahead of blocked B


def test_parked_kernel_answers_the_requests_a_notebook_sends(make_cluster):
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": "3"})
    cluster.start_gs("--policy", "batch")
    cluster.start_ls("host-0", gpus=1)
    cluster.wait_hosts(1)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    wait_parked(cluster, kernel_id)
    info = kc.kernel_info(reply=True, timeout=10)
    assert info["content"]["status"] == "ok"
    assert info["content"]["language_info"]["name"] == "python"
    complete = kc.complete("pri", reply=True, timeout=10)
    assert complete["content"]["status"] == "error"
    assert "parked" in complete["content"]["evalue"]
    kc.is_complete("x = (")
    assert kc.get_shell_msg(timeout=10)["content"]["status"] == "unknown"
    assert kc.comm_info(reply=True, timeout=10)["content"] == {"status": "ok", "comms": {}}
    msg = kc.session.msg("interrupt_request", {})
    kc.control_channel.send(msg)
    reply = kc.control_channel.get_msg(timeout=10)
    assert reply["msg_type"] == "interrupt_reply" and reply["content"]["status"] == "ok"
    # a cell still runs after all that, and the kernel parks again
    assert result_text(run_cell(kc, "x = 5\nx")) == "5"
    wait_parked(cluster, kernel_id)
    # a cell that no host can take within the queue timeout gets an error reply saying why
    other_id, other = cluster.start_kernel(gpus=1)
    wait_parked(cluster, other_id)
    holder = threading.Thread(target=run_cell, args=(other, "import time; time.sleep(8)"))
    holder.start()
    cluster.wait(lambda: cluster.status().gpus_committed == 1, 30, "the other cell running")
    run = run_cell(kc, "x")
    holder.join(timeout=60)
    content = run["reply"]["content"]
    assert content["status"] == "error" and "within 3s" in content["evalue"], content
    # restart: fresh namespace in the next container
    cluster.stub.RestartKernel(global_scheduler_pb2.RestartKernelRequest(kernel_id=kernel_id),
                               timeout=60)
    wait_parked(cluster, kernel_id)
    assert result_text(run_cell(kc, "'x' in dir()")) == "False"


def test_a_container_killed_mid_cell_fails_that_cell_once_and_the_next_starts_from_the_checkpoint(
        make_cluster):
    cluster, kernel_id, kc = parked_batch_kernel(make_cluster)
    assert result_text(run_cell(kc, "n = 1\nn")) == "1"
    wait_parked(cluster, kernel_id)
    out: dict = {}
    cell = threading.Thread(target=lambda: out.setdefault("run", run_cell(
        kc, "import time\nn = 2\nopen('ran', 'a').write('x')\ntime.sleep(30)")))
    cell.start()
    ran = cluster.workdir / "ran"
    cluster.wait(ran.exists, 30, "the cell running")
    pid = cluster.kernel(kernel_id).last_cell_pid
    psutil.Process(pid).kill()
    cell.join(timeout=60)
    content = out["run"]["reply"]["content"]
    assert content["status"] == "error" and "lost before the cell completed" in content["evalue"], content
    status = wait_parked(cluster, kernel_id)
    assert status.message and cluster.status().gpus_committed == 0
    # the next cell runs in a new container with the namespace of the last completed cell
    assert result_text(run_cell(kc, "n")) == "1"
    assert ran.read_text() == "x"  # the killed cell ran once, not again
