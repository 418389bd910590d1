"""The docker launcher's own rules (names, Raft addresses, ports, nvidia-smi output) and its GPU
probe against this machine's engine, which has no NVIDIA runtime: the guard must fall back to
virtual GPUs and leave no container behind."""

from __future__ import annotations

import threading
import uuid

import pytest

from notebookos.local_scheduler.docker_launcher import (
    container_name,
    container_ports,
    detect_gpus,
    parse_nvidia_smi,
    raft_address,
)
from notebookos.local_scheduler.gpus import Gpu
from notebookos.testing.deployment import run


def test_container_name_is_a_dns_label() -> None:
    assert container_name("aaf08314-c52e-4da3-8f2a-29917d6ff05f", 3) == \
        "nbos-aaf08314-c52e-4da3-8f2a-29917d6ff05f-r3"
    odd = container_name("Kernel_ID/with spaces" + "x" * 80, 12)
    assert len(odd) <= 63 and odd.startswith("nbos-kernel-id-with-spaces") and odd.endswith("-r12")


def test_raft_address_names_the_member_container() -> None:
    kid = "k-1"
    assert raft_address(kid, 2, "172.20.0.5:34567") == "nbos-k-1-r2:34567"
    # an address that names a replica container already is kept (a replacement joining)
    assert raft_address(kid, 1, "nbos-k-1-r1:23456") == "nbos-k-1-r1:23456"
    # port 0 (a group of one): the container picks one; its own network namespace has all free
    host, _, port = raft_address(kid, 1, "172.20.0.5:0").rpartition(":")
    assert host == "nbos-k-1-r1" and 20000 <= int(port) < 60000


def test_container_ports_avoid_the_raft_port() -> None:
    ports = container_ports("nbos-k-r1:9002")
    assert len(set(ports.values())) == 5 and 9002 not in ports.values()


def test_parse_nvidia_smi() -> None:
    out = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\nbad line\n"
    assert parse_nvidia_smi(out) == [Gpu(0, "NVIDIA H100 80GB HBM3", 81559 / 1024),
                                     Gpu(1, "NVIDIA H100 80GB HBM3", 81559 / 1024)]


def test_gpu_probe_without_nvidia_runtime_offers_virtual_gpus(notebookos_image: str) -> None:
    import docker

    client = docker.from_env(version="auto")
    if "nvidia" in (client.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime: the GPU path is the one to test here")
    before = set(run(["docker", "ps", "-aq"]).stdout.split())
    gpus, virtual = detect_gpus(client, notebookos_image, 3, 16.0)
    assert virtual and [g.device_id for g in gpus] == [0, 1, 2]
    assert set(run(["docker", "ps", "-aq"]).stdout.split()) <= before  # the probe was removed


@pytest.mark.gpu
def test_gpu_probe_finds_the_engines_gpus(notebookos_image: str) -> None:
    import docker

    client = docker.from_env(version="auto")
    gpus, virtual = detect_gpus(client, notebookos_image, 3, 16.0)
    if virtual:
        pytest.skip("no GPU reachable through this Docker engine")
    assert gpus and all(g.vram_gb > 0 for g in gpus)


def test_close_waits_for_container_starts_under_way(notebookos_image: str) -> None:
    """A Local Scheduler stopped while it was starting a replica container (the Global
    Scheduler replacing replicas that another stopping host lost, under `docker compose down`)
    exits right after its launcher's close(): a container whose start ends later is left
    behind, as CI once saw. So close() must not return while a start is under way, and the
    start, finding the launcher closed, removes its container. The start is held at its
    ``docker create`` by a gate (the launcher and the engine are real)."""
    import docker

    from notebookos.local_scheduler.docker_launcher import LABEL_HOST, DockerLauncher
    from notebookos.local_scheduler.launcher import ReplicaSpec

    gate = threading.Event()
    creating = threading.Event()

    class GatedLauncher(DockerLauncher):
        def _create(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            creating.set()
            gate.wait(60)
            return super()._create(*args, **kwargs)

    client = docker.from_env(version="auto")
    host = f"close-{uuid.uuid4().hex[:8]}"
    network = client.networks.create(f"nbos-test-{host}")
    launcher = GatedLauncher(client, lambda *_: None, host_id=host, image=notebookos_image,
                             network=network.name)

    def ours() -> list:
        return client.containers.list(all=True, filters={"label": f"{LABEL_HOST}={host}"})

    outcome: list[str] = []

    def launch() -> None:
        spec = ReplicaSpec(kernel_id=f"k{host}", replica_id=1, raft_address="127.0.0.1:7001",
                           peers=(), store_url="", key="k", signature_scheme="hmac-sha256")
        try:
            launcher.launch(spec)
            outcome.append("started")
        except RuntimeError as exc:
            outcome.append(str(exc))

    starting = threading.Thread(target=launch)
    closing = threading.Thread(target=launcher.close)
    try:
        starting.start()
        assert creating.wait(60), "the launch never reached docker create"
        closing.start()
        closing.join(timeout=1.5)
        assert closing.is_alive(), "close() returned while a container start was under way"
        gate.set()
        starting.join(timeout=60)
        closing.join(timeout=60)
        assert not closing.is_alive()
        assert outcome and "stopped while" in outcome[0], outcome
        assert not ours(), [c.name for c in ours()]
    finally:
        gate.set()
        starting.join(timeout=60)
        closing.join(timeout=60)
        for container in ours():
            container.remove(force=True)
        network.remove()
