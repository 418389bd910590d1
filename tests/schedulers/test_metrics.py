"""Prometheus metrics of the live daemons: every endpoint `notebookos status --json` names is
served, passes `promtool check metrics`, and counts what happened on a real cluster (a kernel
started, cells run, a replica SIGKILLed); the Global Scheduler's /sd lists every daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sched_cluster import bad_messages_sent, make_cluster_fixture, run_cell  # noqa: F401

from notebookos.testing.processes import free_port

pytestmark = pytest.mark.slow


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback test URL
        return resp.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), float("nan"))


def check_metrics(promtool: str, text: str) -> None:
    """promtool's lint (naming, units, _total on counters, help text) on one scrape."""
    done = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                          capture_output=True, timeout=30)
    assert done.returncode == 0, (done.stdout + done.stderr).decode() + text[:3000]


def status_json(address: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "notebookos.cli", "status", "--json",
                           "--global-scheduler", address], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def test_every_endpoint_is_live_lints_clean_and_counts_events(make_cluster, promtool):  # noqa: F811
    gs_metrics_port = free_port()
    cluster = make_cluster()
    cluster.start_gs("--metrics-port", str(gs_metrics_port))
    for i in range(3):
        cluster.start_ls(f"m-host-{i}", gpus=2)
    cluster.wait_hosts(3)

    doc = status_json(cluster.gs_address)
    urls = doc["metrics"]
    assert urls["global_scheduler"] == f"http://127.0.0.1:{gs_metrics_port}/metrics"
    assert sorted(urls["local_schedulers"]) == ["m-host-0", "m-host-1", "m-host-2"]
    for text in map(fetch, [urls["global_scheduler"], *urls["local_schedulers"].values()]):
        check_metrics(promtool, text)

    # Prometheus HTTP service discovery: the GS and every LS, with their roles and host ids.
    sd = json.loads(fetch(urls["service_discovery"]))
    by_target = {g["targets"][0]: g["labels"] for g in sd}
    assert by_target[f"127.0.0.1:{gs_metrics_port}"] == {"notebookos_role": "global_scheduler"}
    for host_id, url in urls["local_schedulers"].items():
        target = url.removeprefix("http://").removesuffix("/metrics")
        assert by_target[target] == {"notebookos_role": "local_scheduler", "host_id": host_id}

    gs = fetch(urls["global_scheduler"])
    assert value(gs, "notebookos_hosts", state="active") == 3
    assert value(gs, "notebookos_gpus_provisioned") == 6
    assert value(gs, "notebookos_kernels", state="idle") == 0  # pre-created, at 0
    assert value(gs, "notebookos_replica_failures_total", cause="died") == 0

    kernel_id, kc = cluster.start_kernel(gpus=1)
    for i in range(3):
        assert run_cell(kc, f"x = {i}")["reply"]["content"]["status"] == "ok"

    gs = fetch(urls["global_scheduler"])
    check_metrics(promtool, gs)
    assert value(gs, "notebookos_kernels", state="idle") == 1
    assert value(gs, "notebookos_replicas") == 3
    assert value(gs, "notebookos_gpus_subscribed") == 3
    assert value(gs, "notebookos_subscription_ratio") == pytest.approx(3 / (6 * 3))
    assert value(gs, "notebookos_cell_interactivity_delay_seconds_count") == 3
    assert value(gs, "notebookos_cell_queue_seconds_count") == 3
    assert value(gs, "notebookos_placement_seconds_count", operation="kernel_start") == 1
    assert 0 < value(gs, "notebookos_cell_interactivity_delay_seconds_sum") < 30
    starts = commits = 0.0
    for url in urls["local_schedulers"].values():
        text = fetch(url)
        check_metrics(promtool, text)
        starts += sum(value(text, "notebookos_replica_starts_total", source=source,
                            outcome="succeeded") for source in ("fork_server", "cold"))
        commits += value(text, "notebookos_gpu_commits_total", outcome="committed")
        assert value(text, "notebookos_host_gpus", state="idle") == 2  # released after the cell
    assert starts == 3
    # one binding per cell, except a cell that follows its predecessor within the release
    # hold: it keeps the predecessor's GPUs (hosts.py, take_over_held)
    assert 1 <= commits <= 3

    # Messages the kernel's front drops are counted here as in the kernel's status.
    def dropped() -> float:
        text = fetch(urls["global_scheduler"])
        return sum(value(text, "notebookos_dropped_messages_total", reason=r)
                   for r in ("bad_signature", "malformed"))

    with bad_messages_sent(cluster.kernel(kernel_id).connection.shell_port):
        cluster.wait(lambda: dropped() == 2, 10, "both bad messages counted in the metrics")
    assert cluster.kernel(kernel_id).dropped_messages == 2

    # SIGKILL one replica: its host counts a death, the GS a replica failure and a replacement.
    status = cluster.kernel(kernel_id)
    victim = next(r for r in status.replicas if not r.executor)
    os.kill(victim.pid, signal.SIGKILL)
    cluster.wait(lambda: value(fetch(urls["global_scheduler"]), "notebookos_placement_seconds_count",
                               operation="replica_replacement") == 1, 90, "a replacement replica")
    gs = fetch(urls["global_scheduler"])
    assert value(gs, "notebookos_replica_failures_total", cause="died") == 1
    died = sum(value(fetch(u), "notebookos_replica_exits_total", cause="died")
               for u in urls["local_schedulers"].values())
    assert died == 1
    assert run_cell(kc, "x")["reply"]["content"]["status"] == "ok"


def test_status_json_without_metrics_endpoints_is_empty_strings() -> None:
    from notebookos.commands.status_cmd import status_document
    from notebookos.proto import common_pb2, global_scheduler_pb2

    status = global_scheduler_pb2.ClusterStatus(hosts=[common_pb2.HostStatus(host_id="h")])
    assert status_document(status)["metrics"] == {
        "global_scheduler": "", "local_schedulers": {"h": ""}, "service_discovery": ""}


def test_metrics_over_mutual_tls_only_for_cluster_certificates(make_cluster, promtool):  # noqa: F811
    """``security.metrics_tls``: every endpoint is HTTPS with the cluster's certificate, a
    scraper that presents a certificate of the cluster CA gets the metrics (and they lint
    clean), one without a client certificate or over plain HTTP gets nothing, and
    `notebookos status --json` names https URLs."""
    import ssl
    import urllib.error

    from notebookos.security import credential_files
    from notebookos.testing.credentials import security_config

    cluster = make_cluster({"NOTEBOOKOS_SECURITY_METRICS_TLS": "true"})
    cluster.start_gs()
    cluster.start_ls("tls-host-0", gpus=2)
    cluster.wait_hosts(1)
    done = subprocess.run([sys.executable, "-m", "notebookos.cli", "status", "--json",
                           "--global-scheduler", cluster.gs_address,
                           "--state-dir", str(cluster.workdir / "state")],
                          capture_output=True, timeout=60, env=cluster.env)
    assert done.returncode == 0, done.stderr.decode()
    urls = json.loads(done.stdout)["metrics"]
    endpoints = [urls["global_scheduler"], *urls["local_schedulers"].values()]
    assert all(u.startswith("https://127.0.0.1:") for u in endpoints), urls
    assert urls["service_discovery"].startswith("https://"), urls

    files = credential_files(security_config())  # the test session's cluster credentials
    scraper = ssl.create_default_context(cafile=str(files.ca))
    scraper.check_hostname = False  # the cluster certificate names "notebookos", not 127.0.0.1
    scraper.load_cert_chain(str(files.cert), str(files.key))
    for url in endpoints:
        with urllib.request.urlopen(url, timeout=10, context=scraper) as resp:  # noqa: S310
            text = resp.read().decode()
        check_metrics(promtool, text)
        assert "notebookos_" in text
    with urllib.request.urlopen(urls["service_discovery"], timeout=10, context=scraper) as resp:  # noqa: S310
        assert len(json.loads(resp.read())) == 2  # the GS and the one LS

    anonymous = ssl.create_default_context(cafile=str(files.ca))
    anonymous.check_hostname = False
    for url in endpoints:
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(url, timeout=10, context=anonymous).read()  # noqa: S310
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            fetch(url.replace("https://", "http://"))
    # The daemons keep serving scrapers after refusing those, and while a client that
    # connected sends nothing (its TLS handshake waits in its own thread).
    import socket

    host, port = endpoints[0].removeprefix("https://").removesuffix("/metrics").split(":")
    with socket.create_connection((host, int(port)), timeout=5):
        with urllib.request.urlopen(endpoints[0], timeout=5, context=scraper) as resp:  # noqa: S310
            assert resp.status == 200
