"""The monitoring stack of deploy/monitoring: the dashboard asks only for metrics the daemons
register; a real Prometheus (Debian's) with the shipped configuration finds every daemon of a
live cluster through the Global Scheduler's /sd, and every dashboard query returns data."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sched_cluster import make_cluster_fixture, run_cell  # noqa: F401 - fixture

from notebookos.metrics import (
    ClusterSnapshot,
    GlobalSchedulerMetrics,
    HostSnapshot,
    LocalSchedulerMetrics,
)
from notebookos.testing.processes import free_port, kill_group, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "notebookos.json"


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]]


def registered_series() -> set[str]:
    names = set()
    for registry in (GlobalSchedulerMetrics(ClusterSnapshot).registry,
                     LocalSchedulerMetrics(HostSnapshot).registry):
        for family in registry.collect():
            names.update(s.name for s in family.samples)
    return names


def test_dashboard_asks_only_for_registered_metrics_from_the_provisioned_source() -> None:
    series = registered_series()
    datasource = yaml.safe_load(
        (MONITORING / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["panels"]
    for panel in doc["panels"]:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
    for title, expr in dashboard_queries():
        for name in re.findall(r"notebookos_[a-z_]+", expr):
            assert name in series, f"panel {title!r} asks for {name}, which no daemon serves"


def test_prometheus_configurations_are_valid(promtool: str) -> None:
    for name in ("prometheus.yml", "prometheus-local.yml"):
        done = subprocess.run([promtool, "check", "config", str(MONITORING / name)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr


def query(base: str, expr: str) -> list:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


@pytest.fixture
def prometheus_for(prometheus_binary: str, tmp_path: Path) -> Iterator:
    """``start(gs_metrics_port)`` -> the base URL of a Prometheus using prometheus-local.yml."""
    procs: list[subprocess.Popen] = []

    def start(gs_metrics_port: int) -> str:
        config = (MONITORING / "prometheus-local.yml").read_text()
        config = config.replace("127.0.0.1:9479", f"127.0.0.1:{gs_metrics_port}")
        config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
        config = config.replace("refresh_interval: 10s", "refresh_interval: 1s")
        (tmp_path / "prometheus.yml").write_text(config)
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed by the process
        proc = subprocess.Popen(
            [prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        assert wait_for_port(port, 30, proc), (tmp_path / "prometheus.log").read_text()[-2000:]
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        kill_group(proc)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_prometheus_finds_every_daemon_and_every_panel_has_data(make_cluster,  # noqa: F811
                                                                 prometheus_for) -> None:
    gs_port = free_port()
    cluster = make_cluster()
    cluster.start_gs("--metrics-port", str(gs_port))
    for i in range(3):
        cluster.start_ls(f"p-host-{i}", gpus=2)
    cluster.wait_hosts(3)
    base = prometheus_for(gs_port)
    _, kc = cluster.start_kernel(gpus=1)

    def targets_up() -> int:
        url = f"{base}/api/v1/targets"
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
            active = json.loads(resp.read())["data"]["activeTargets"]
        return sum(t["health"] == "up" for t in active)

    cluster.wait(lambda: targets_up() == 4, 60, "Prometheus scraping the GS and three LSs")
    deadline = time.monotonic() + 8  # cells spread over several scrapes, for the rates
    n = 0
    while time.monotonic() < deadline:
        assert run_cell(kc, f"v = {n}")["reply"]["content"]["status"] == "ok"
        n += 1
        time.sleep(0.3)
    hosts = query(base, 'notebookos_host_gpus{state="idle"}')
    assert sorted(r["metric"]["host_id"] for r in hosts) == ["p-host-0", "p-host-1", "p-host-2"]
    # The latest scrape may have caught a cell running (the kernel busy): the next ones, after
    # the last cell, must see it idle (a full CI run queried at once and read idle = 0)
    cluster.wait(lambda: query(base, "notebookos_kernels{state=\"idle\"}")[0]["value"][1] == "1",
                 10, "Prometheus seeing the kernel idle after its last cell")
    empty = [(title, expr) for title, expr in dashboard_queries() if not query(base, expr)]
    assert not empty, f"dashboard queries without data: {empty}"
    delay = query(base, dashboard_queries()[[e for _, e in dashboard_queries()].index(
        "histogram_quantile(0.5, sum by (le) (rate("
        "notebookos_cell_interactivity_delay_seconds_bucket[5m])))")][1])
    assert 0 < float(delay[0]["value"][1]) < 10
