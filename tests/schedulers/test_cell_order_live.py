"""The live cell orders (global_scheduler.cell_order) on real clusters, more notebooks than GPUs.

- ``themis``, sustained: three hosts with one virtual GPU each, every host holding a replica of
  every kernel (no migration can help); alice runs four notebooks and bob one, all running cells
  back to back for 30 s, each cell 0.5-1.5 s long (drawn per cell: equal cells make the three
  GPUs free up together, the two waiting cells take two of them and no choice is ever made, so
  no order can show). In arrival order every notebook waits about the same; by finish-time
  fairness bob, who has the smaller share of the GPU time, goes first whenever a GPU frees up,
  so his cells wait much less than hers (each notebook's mean wait per cell, the replies'
  ``waited_ms``).
- ``themis`` and ``qssf``, one decision: one host with one GPU, one replica per kernel; a cell
  holds the GPU while four more arrive one after another and wait. By fairness bob's cell, last
  to arrive, runs first; by QSSF, having learnt each notebook's durations from its earlier cells,
  the short notebook's cell does. Arrival order would run either last.
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from sched_cluster import (
    make_cluster_fixture,  # noqa: F401 - the fixture
    run_seen,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CONTENTION_S = 30.0


def start_cluster(make_cluster, order: str):  # noqa: ANN001, ANN201
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "7",
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": "120",
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_ORDER": order})
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=1, prewarm=0)
    cluster.wait_hosts(3)
    return cluster


def contend(kernels: dict[str, object], code: dict[str, str], seconds: float
            ) -> dict[str, list[float]]:
    """Every notebook runs its cell back to back for ``seconds``; its waits for GPUs (s)."""
    waits: dict[str, list[float]] = {name: [] for name in kernels}
    errors: list[str] = []
    barrier = threading.Barrier(len(kernels))

    def notebook(name: str) -> None:
        kc = kernels[name]
        barrier.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            run = run_seen(kc, code[name], timeout=120)
            content = run["reply"]["content"]
            if content["status"] != "ok":
                errors.append(f"{name}: {content}")
                return
            meta = run["reply"]["metadata"]["notebookos"]
            waits[name].append(meta.get("waited_ms", 0) / 1000 if meta.get("waited_for") else 0)

    threads = [threading.Thread(target=notebook, args=(n,)) for n in kernels]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 150)
    assert not errors, errors
    return waits


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def test_themis_serves_the_user_with_one_notebook_before_the_user_with_four(make_cluster
                                                                            ) -> None:  # noqa: ANN001, F811
    cluster = start_cluster(make_cluster, "themis")
    kernels = {}
    for name, user in [("alice-1", "alice"), ("alice-2", "alice"), ("alice-3", "alice"),
                       ("alice-4", "alice"), ("bob", "bob")]:
        _, kc = cluster.start_kernel(gpus=1, hints={"user": user, "notebook": f"{name}.ipynb"})
        assert run_seen(kc, "import time")["reply"]["content"]["status"] == "ok"
        kernels[name] = kc
    jittered = "time.sleep(0.5 + time.time_ns() % 1009 / 1009)"
    waits = contend(kernels, dict.fromkeys(kernels, jittered), CONTENTION_S)
    alice = [w for n, ws in waits.items() if n.startswith("alice") for w in ws]
    bob = waits["bob"]
    summary = {n: (len(ws), round(mean(ws), 2), [round(w, 1) for w in ws])
               for n, ws in waits.items()}
    print("waits per notebook (cells, mean s, each):", summary)
    # Served in arrival order every notebook waits about the same (measured here, 2026-11-26,
    # 1 s cells: bob 0.68 s per cell, alice 0.55-0.92 s); by fairness bob waited 0.34-0.43 s,
    # alice 0.51-0.92 s (3 runs), but once bob 0.54 and alice 0.69: the GPUs had fallen in phase
    # (bob waited 1.0, 0.0, 1.0, 0, 0.9, 0.1 ...), hence the drawn durations.
    assert mean(bob) < 0.75 * mean(alice), (summary["bob"], summary, cluster.log("gs"))
    assert len(bob) > statistics.fmean(len(ws) for n, ws in waits.items() if n != "bob"), summary


def one_gpu_cluster(make_cluster, order: str):  # noqa: ANN001, ANN201
    """One host with one GPU, one replica per kernel, cells served in ``order``."""
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_REPLICAS_PER_KERNEL": "1",
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_ORDER": order})
    cluster.start_gs()
    cluster.start_ls("host-0", gpus=1, prewarm=0)
    cluster.wait_hosts(1)
    return cluster


def queued_completion_order(cluster, blocker, queued: list[tuple[str, object, str]]  # noqa: ANN001
                            ) -> list[str]:
    """``blocker`` holds the only GPU while the ``queued`` cells (name, client, code) arrive one
    after another and wait; the names in the order their cells completed."""
    done: list[str] = []
    lock = threading.Lock()

    def run(name: str, kc, code: str) -> None:  # noqa: ANN001
        reply = run_seen(kc, code, timeout=120)["reply"]
        assert reply["content"]["status"] == "ok", (name, reply["content"])
        with lock:
            done.append(name)

    threads = [threading.Thread(target=run, args=("blocker", blocker, "time.sleep(3)"))]
    threads[0].start()
    time.sleep(0.5)
    for name, kc, code in queued:
        threads.append(threading.Thread(target=run, args=(name, kc, code)))
        threads[-1].start()
        time.sleep(0.3)  # arrival order is the order of ``queued``
    for t in threads:
        t.join(150)
    assert len(done) == len(queued) + 1, (done, cluster.log("gs"))
    return done


def test_qssf_serves_the_notebook_of_short_cells_first(make_cluster) -> None:  # noqa: ANN001, F811
    """One host with one GPU, one replica per kernel: three notebooks of long cells and one of
    short cells wait behind a running cell, the short one last to arrive; QSSF, having learnt
    each notebook's durations from its earlier cells, runs the short cell first (arrival order
    would run it last)."""
    cluster = one_gpu_cluster(make_cluster, "qssf")
    kernels, queued = {}, []
    for name, seconds in [("blocker", 3), ("long-1", 1.0), ("long-2", 1.0), ("long-3", 1.0),
                          ("short", 0.1)]:
        _, kc = cluster.start_kernel(gpus=1, hints={"user": "carol", "notebook": f"{name}.ipynb"})
        # The history QSSF learns from: this notebook's cells, run alone.
        for first in ("import time", f"time.sleep({seconds})"):
            assert run_seen(kc, first)["reply"]["content"]["status"] == "ok"
        kernels[name] = kc
        if name != "blocker":
            queued.append((name, kc, f"time.sleep({seconds})"))
    order = queued_completion_order(cluster, kernels["blocker"], queued)
    # The long ones follow in the order of their (nearly equal) learnt durations.
    assert order[:2] == ["blocker", "short"], (order, cluster.log("gs"))


def test_themis_serves_a_waiting_user_with_no_gpu_time_before_a_busy_one(make_cluster
                                                                         ) -> None:  # noqa: ANN001, F811
    """Alice's notebook holds the only GPU and three more of hers wait; bob's cell arrives last
    and runs first (arrival order would run it last)."""
    cluster = one_gpu_cluster(make_cluster, "themis")
    kernels, queued = {}, []
    for name in ("blocker", "alice-2", "alice-3", "alice-4", "bob"):
        user = "bob" if name == "bob" else "alice"
        _, kc = cluster.start_kernel(gpus=1, hints={"user": user, "notebook": f"{name}.ipynb"})
        assert run_seen(kc, "import time")["reply"]["content"]["status"] == "ok"
        kernels[name] = kc
        if name != "blocker":
            queued.append((name, kc, "time.sleep(0.5)"))
    order = queued_completion_order(cluster, kernels["blocker"], queued)
    assert order[:2] == ["blocker", "bob"], (order, cluster.log("gs"))
