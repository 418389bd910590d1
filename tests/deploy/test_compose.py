"""`docker compose up` on this machine: three Local Scheduler containers (virtual GPUs) with the
docker launcher, a notebook through JupyterLab, failures, and `docker compose down`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
from notebook_check import ROOT, check_notebook, kernel_of, stop_and_check_removed

from notebookos.ports import free_ports
from notebookos.testing.deployment import ComposeDeployment, output_text, run, run_cells

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def compose(notebookos_image: str):
    dep = ComposeDeployment(ROOT, f"nbostest{uuid.uuid4().hex[:6]}", notebookos_image,
                            free_ports(1)[0])
    try:
        start = time.monotonic()
        dep.up()
        dep.wait_for_jupyterlab()
        dep.wait_for_hosts(3)
        print(f"\ncompose up to a usable JupyterLab with 3 hosts: {time.monotonic() - start:.1f} s")
        yield dep
    finally:
        dep.purge()


def test_compose_runs_a_notebook_in_replica_containers(compose: ComposeDeployment) -> None:
    kernel_id = check_notebook(compose)
    stop_and_check_removed(compose, kernel_id)


def test_local_scheduler_crash_keeps_its_replica_containers(compose: ComposeDeployment) -> None:
    """A Local Scheduler killed abruptly is restarted by compose's restart policy, takes its
    running replica containers back, and the notebook carries on."""
    port, token = compose.jupyter_port, compose.token()
    from notebookos.testing.deployment import start_kernel

    kernel_id = asyncio.run(start_kernel(port, token))
    assert asyncio.run(run_cells(port, token, kernel_id, ["y = 'kept'"]))[0]["reply"]["status"] \
        == "ok"
    before = compose.replica_containers(kernel_id)
    kernel = kernel_of(compose.status(), kernel_id)
    victim = next(r for r in kernel["replicas"] if r["replica_id"] != kernel["executor"])
    ls_container = next(c for c in run(["docker", "ps", "--format", "{{.Names}}"]).stdout.split()
                        if c == victim["host_id"])
    pid = int(run(["docker", "inspect", "--format", "{{.State.Pid}}", ls_container]).stdout)
    os.kill(pid, signal.SIGKILL)  # a crash, not `docker kill` (which counts as a manual stop)

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        logs = run(["docker", "logs", ls_container], check=False).stderr
        if f"recovered replica {kernel_id}/{victim['replica_id']}" in logs \
                and "registered host" in logs.rsplit("recovered replica", 1)[1]:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"{ls_container} did not take its replica back:\n{logs[-3000:]}")
    assert compose.replica_containers(kernel_id) == before  # the same containers
    result = asyncio.run(run_cells(port, token, kernel_id, ["print(y)"]))
    assert output_text(result[0]).strip() == "kept", result
    kernel = kernel_of(compose.status(), kernel_id)
    assert {r["replica_id"] for r in kernel["replicas"]} == set(before), kernel
    stop_and_check_removed(compose, kernel_id)


def test_the_monitoring_profiles_prometheus_scrapes_every_daemon(
        compose: ComposeDeployment, prometheus_image: str) -> None:
    """docker-compose.monitoring.yml's Prometheus, with deploy/monitoring/prometheus.yml as
    shipped, finds the Global Scheduler and every Local Scheduler through the GS's /sd and
    scrapes them. (Grafana, the profile's other service, cannot be had here: no registry, no
    Debian package; docs/observability.md.)"""
    port = free_ports(1)[0]
    compose.env.update(NOTEBOOKOS_PROMETHEUS_IMAGE=prometheus_image,
                       NOTEBOOKOS_PROMETHEUS_PORT=str(port))
    overlay = ("-f", str(ROOT / "docker-compose.monitoring.yml"), "--profile", "monitoring")
    hosts = sorted(h["id"] for h in compose.status()["hosts"])
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        compose.compose(*overlay, "up", "-d", "--no-deps", "prometheus")
        deadline = time.monotonic() + 120
        active: list = []
        while time.monotonic() < deadline:
            try:
                active = _get_json(f"{base}/targets")["data"]["activeTargets"]
            except OSError:
                active = []
            if sum(t["health"] == "up" for t in active) == 1 + len(hosts):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"Prometheus did not scrape the GS and {hosts}: {active}\n"
                                 + compose.compose(*overlay, "logs", "prometheus").stdout[-3000:])
        roles = sorted((t["labels"]["notebookos_role"], t["labels"].get("host_id", ""))
                       for t in active)
        assert roles == [("global_scheduler", ""),
                         *(("local_scheduler", h) for h in hosts)], roles
        query = urllib.parse.urlencode({"query": 'sum(notebookos_hosts{state="active"})'})
        result = _get_json(f"{base}/query?{query}")["data"]["result"]
        assert result and float(result[0]["value"][1]) == len(hosts), result
    finally:
        compose.compose(*overlay, "rm", "--stop", "--force", "--volumes", "prometheus",
                        check=False)
        run(["docker", "volume", "rm", f"{compose.project}_prometheus-data"], check=False)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


def test_compose_down_leaves_nothing(compose: ComposeDeployment, tmp_path: Path) -> None:
    """Last in this module: `down` removes every container (the replica containers too, which
    the Local Schedulers made) and the network, keeps the state volumes; `down -v` drops them."""
    from notebookos.testing.deployment import start_kernel

    port, token = compose.jupyter_port, compose.token()
    kernel_id = asyncio.run(start_kernel(port, token))
    # The REST create answers once the kernel's front is bound; its replicas start behind it.
    assert asyncio.run(run_cells(port, token, kernel_id, ["1"]))[0]["reply"]["status"] == "ok"
    assert len(compose.replica_containers(kernel_id)) == 3
    started = time.monotonic()
    with compose.following_logs(tmp_path / "down.log") as log:
        compose.down(volumes=False)
    took = time.monotonic() - started
    left = compose.leftovers()
    said = "\n".join(line for line in log.read_text(errors="replace").splitlines()
                     if line.startswith(("ls", "notebookos-ls")) or "local-scheduler" in line)
    assert not left.containers and not left.networks, \
        f"{left}\ndown took {took:.1f} s; the Local Schedulers said:\n{said[-12000:]}"
    assert len(left.volumes) == 6, left
    compose.down(volumes=True)
    assert not compose.leftovers(), compose.leftovers()
