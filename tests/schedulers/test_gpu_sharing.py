"""GPU sharing live (issue 17, TensorShare): on a cluster of one Local Scheduler with one virtual
GPU and ``global_scheduler.gpu_sharing = tensorshare``, two kernels whose gpu_sla allows sharing
run long cells at the same time on the one device (both bound to device 0; the Global and the
Local Scheduler's status say who shares it); a third such kernel waits (never three on a device)
and runs beside the second once the first is done; a kernel with gpu_sla 1 never shares: it
waits until the device is free, and its cell overlaps no other.

The host is configured to run MPS: the replicas of the kernels that may share start with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the gpu_sla 1 kernel's without.

Each kernel has one replica (the single host holds at most one replica of a kernel), so no
migration can give the waiting cells a GPU either: they wait for the device.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from sched_cluster import make_cluster_fixture  # noqa: F401 - the fixture
from sched_cluster import run_seen as _run
from sched_cluster import stream_text as _text

from notebookos.commands.status_cmd import render_text, status_document
from notebookos.proto import local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.testing.credentials import connect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CELL = ("import time\nfrom notebookos.kernel.gpu_binding import assigned_gpus\n"
        "t0 = time.time(); time.sleep({s}); print(list(assigned_gpus()), t0, time.time())")


def _interval(run: dict) -> tuple[list[int], float, float]:
    """(device ids, start, end) the cell printed."""
    assert run["reply"]["content"]["status"] == "ok", run["reply"]["content"]
    ids, start, end = _text(run, "stdout").strip().rsplit(" ", 2)
    return json.loads(ids), float(start), float(end)


def _ls_shared(address: str) -> dict[int, list[str]]:
    with connect(address) as channel:
        host = ls_grpc.LocalSchedulerStub(channel).GetHostStatus(
            local_scheduler_pb2.GetHostStatusRequest(), timeout=10).host
    return {g.device_id: list(g.shared_by) for g in host.gpus if g.shared_by}


def test_two_kernels_share_one_gpu_never_three_and_sla_1_never_shares(make_cluster) -> None:  # noqa: ANN001, F811
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_GPU_SHARING": "tensorshare",
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_GPU_SHARING_PREDICTOR": "ridge",
                            "NOTEBOOKOS_CLUSTER_REPLICAS_PER_KERNEL": "1",
                            "NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "8",
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": "120",
                            # the host runs MPS (virtual GPUs here: only the replicas'
                            # environment shows it)
                            "NOTEBOOKOS_LOCAL_SCHEDULER_MPS": "true",
                            "NOTEBOOKOS_LOCAL_SCHEDULER_MPS_PERCENTAGE": "30"})
    cluster.start_gs()
    cluster.start_ls("host-0", gpus=1, prewarm=0)
    cluster.wait_hosts(1)
    names = ("a", "b", "c", "never")
    slas = {"a": "2", "b": "2", "c": "2", "never": "1"}
    kernels = {n: cluster.start_kernel(gpus=1, hints={"gpu_sla": slas[n]}) for n in names}
    for name, (_, kc) in kernels.items():  # each kernel up, one cell run alone
        env = _run(kc, "import os; print(os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'))")
        # MPS caps the SMs of the replicas of kernels that may share, not the others'
        assert _text(env, "stdout") == ("None\n" if name == "never" else "30\n"), (name, env)
    owner = {n: f"{kid}/1" for n, (kid, _) in kernels.items()}
    ls_address = cluster.status().hosts[0].address

    runs: dict[str, dict] = {}

    def cell(name: str, seconds: float) -> None:
        runs[name] = _run(kernels[name][1], CELL.format(s=seconds), timeout=150)

    # b runs well past a (b may start within milliseconds of a), so c, which waits for a's
    # place, runs beside b.
    threads = {"a": threading.Thread(target=cell, args=("a", 5))}
    threads["a"].start()
    cluster.wait(lambda: cluster.status().hosts[0].gpus_committed == 1, 20, "a's cell running")
    threads["b"] = threading.Thread(target=cell, args=("b", 10))
    threads["b"].start()
    cluster.wait(lambda: list(cluster.status().hosts[0].gpus[0].shared_by)
                 == [owner["a"], owner["b"]], 20, "a and b sharing GPU 0")
    # The Local Scheduler binds the same device to both and says so.
    assert _ls_shared(ls_address) == {0: [owner["a"], owner["b"]]}
    doc = status_document(cluster.status())
    assert doc["hosts"][0]["shared_gpus"] == [{"device_id": 0,
                                               "replicas": [owner["a"], owner["b"]]}]
    assert f"GPU 0 shared by {owner['a']} and {owner['b']}" in render_text(doc)

    # A third sharer and an exclusive kernel both wait.
    threads["c"] = threading.Thread(target=cell, args=("c", 3))
    threads["never"] = threading.Thread(target=cell, args=("never", 1))
    threads["c"].start()
    threads["never"].start()
    time.sleep(2.0)
    shared = list(cluster.status().hosts[0].gpus[0].shared_by)
    assert shared == [owner["a"], owner["b"]], shared
    assert _ls_shared(ls_address) == {0: [owner["a"], owner["b"]]}
    for t in threads.values():
        t.join(150)
    assert set(runs) == set(names), (set(runs), cluster.log("gs"))

    spans = {n: _interval(runs[n]) for n in names}
    for n, (ids, _, _) in spans.items():
        assert ids == [0], (n, ids)
    a, b, c, never = (spans[n][1:] for n in names)
    assert a[0] < b[0] < a[1], (a, b)  # a and b ran at the same time, on the same device
    # Never three on the device: c started once a was done, and ran beside b.
    assert c[0] >= a[1] - 0.05, (a, c)
    assert c[0] < b[1], (b, c)
    # gpu_sla 1: its cell overlapped no other.
    for n in ("a", "b", "c"):
        start, end = spans[n][1:]
        assert never[0] >= end - 0.05 or never[1] <= start + 0.05, (n, spans[n], never)
    # Both waiting cells were told why.
    note_c = _text(runs["c"], "stderr")
    assert "waiting for 1 GPU(s)" in note_c and "already shared by 2 kernels" in note_c, note_c
    note_never = _text(runs["never"], "stderr")
    assert "gpu_sla is 1 (it never shares a GPU)" in note_never, note_never
    for n in ("c", "never"):
        assert runs[n]["reply"]["metadata"]["notebookos"].get("waited_for") == "GPUs"
    # Everything released: no device held, none shared.
    cluster.wait(lambda: cluster.status().hosts[0].gpus_committed == 0
                 and not cluster.status().hosts[0].gpus[0].shared_by, 10, "GPU 0 free")
    cluster.wait(lambda: not _ls_shared(ls_address), 10, "GPU 0 free on the host")
