"""Forecast-driven scaling live (``global_scheduler.scaling = ces``): a static pool of five 1-GPU
hosts (three replicas per kernel), a compressed day (48 s, a check every second: an "hour" is two
checks). The Global Scheduler starts with three days of this cluster's history in its state
directory (three hosts running from 8 h to 16 h, none at night) and goes on from 8 h of the
fourth day. Three notebooks run cells; at 16 h one of them stops: running hosts fall and the
forecast says they will keep falling, so the idle surplus goes to sleep (the static pool's
reserve). Then six cells arrive at once: the waiting ones wake the sleeping hosts, and every
cell completes."""

from __future__ import annotations

import json
import threading

import pytest
from sched_cluster import make_cluster_fixture, run_seen  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHECKS_PER_DAY = 48  # ces_day_s / ces_check_interval_s


def seeded_history(days: int, until_hour: float) -> list[float]:
    def running(i: int) -> float:
        hour = (i % CHECKS_PER_DAY) * 24 / CHECKS_PER_DAY
        return 3.0 if 8 <= hour < 16 else 0.0

    n = days * CHECKS_PER_DAY + round(until_hour * CHECKS_PER_DAY / 24)
    return [running(i) for i in range(n)]


def test_ces_puts_the_surplus_to_sleep_as_demand_falls_and_wakes_it_for_waiting_cells(
        make_cluster, tmp_path) -> None:  # noqa: ANN001, F811
    cluster = make_cluster({
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE": "true",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_HOST_PROVIDER": "static",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE_INTERVAL_S": "0.5",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALING_BUFFER_HOSTS": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALING": "ces",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALE_IN": "idle",  # hosts holding idle replicas may sleep
        "NOTEBOOKOS_GLOBAL_SCHEDULER_CES_CHECK_INTERVAL_S": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_CES_DAY_S": str(CHECKS_PER_DAY),
        "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": "120",
        "NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "7",
    })
    history_file = cluster.workdir / "state" / "global_scheduler" / "scaling-history.json"
    history_file.parent.mkdir(parents=True)
    history_file.write_text(json.dumps({"running_hosts": seeded_history(3, until_hour=8)}))
    cluster.start_gs()
    for i in range(5):
        cluster.start_ls(f"host-{i}", gpus=1, prewarm=0)
    cluster.wait_hosts(5)

    def checks() -> int:
        return len(json.loads(history_file.read_text())["running_hosts"])

    def reserved() -> list[str]:
        return [h.host_id for h in cluster.status().hosts if h.draining]

    flags = {name: tmp_path / f"stop-{name}" for name in "abc"}
    kernels = {}
    for name in "abc":
        _, kc = cluster.start_kernel(gpus=1)
        assert run_seen(kc, "import os, time")["reply"]["content"]["status"] == "ok"
        kernels[name] = kc
    for name, kc in kernels.items():  # three hosts running, as the history says for the day
        kc.execute(f"while not os.path.exists({str(flags[name])!r}): time.sleep(0.1)")
    cluster.wait(lambda: cluster.status().gpus_committed == 3, 30, "three cells running")
    assert not reserved()

    # 16 h: one notebook stops. Running hosts fall (3 -> 2) and the forecast says they will
    # keep falling: the idle surplus beyond running + buffer (5 - 3) goes to sleep, its idle
    # replicas moved to the hosts that stay awake (one whose replicas cannot all move stays).
    sixteen = 3 * CHECKS_PER_DAY + 16 * CHECKS_PER_DAY // 24
    cluster.wait(lambda: checks() >= sixteen, 60, "16 h of the fourth day")
    flags["c"].touch()
    assert kernels["c"].get_shell_msg(timeout=30)["content"]["status"] == "ok"
    cluster.wait(lambda: len(reserved()) >= 1, 40, "hosts asleep")
    assert cluster.status().gpus_committed == 2
    for name in "ab":
        flags[name].touch()
        assert kernels[name].get_shell_msg(timeout=30)["content"]["status"] == "ok"

    # Six cells at once on the awake GPUs: the waiting ones wake the sleeping hosts (a
    # replica of each moves there) and every cell completes.
    more = [cluster.start_kernel(gpus=1)[1] for _ in range(3)]
    results: list[dict] = []
    lock = threading.Lock()

    def cell(kc) -> None:  # noqa: ANN001
        run = run_seen(kc, "import time; time.sleep(3); 'done'", timeout=150)
        with lock:
            results.append(run["reply"]["content"])

    threads = [threading.Thread(target=cell, args=(kc,)) for kc in [*kernels.values(), *more]]
    for t in threads:
        t.start()
    cluster.wait(lambda: not reserved(), 60, "the sleeping hosts woken")
    for t in threads:
        t.join(150)
    assert len(results) == 6 and all(r["status"] == "ok" for r in results), (
        results, cluster.log("gs"))
