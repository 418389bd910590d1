"""The embedded default, as `notebookos up` starts it on a fresh machine (no NOTEBOOKOS_SECURITY_*
setting: the credentials are made in the state directory): clients without the cluster's
certificate are refused in the TLS handshake, a certificate without the join token cannot
register a host, and `notebookos status` works for the user who has the files.

The cluster is started by ``start_schedulers``, the code `notebookos up` runs before JupyterLab
(tests/jupyter/test_up.py runs the whole command)."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from notebookos.commands.up_cmd import start_schedulers
from notebookos.config import Config, load_config
from notebookos.proto import (
    common_pb2,
    global_scheduler_pb2,
    global_scheduler_pb2_grpc,
    local_scheduler_pb2,
    local_scheduler_pb2_grpc,
)
from notebookos.security import (
    METADATA_KEY,
    JoinTokens,
    credential_files,
    ensure_cluster_credentials,
    load_tls,
    secure_channel,
)
from notebookos.supervisor import Supervisor
from notebookos.testing.processes import free_port

pytestmark = pytest.mark.timeout(240)

# what a user's shell on a fresh machine has: no security setting at all
FRESH_ENV = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOKOS_SECURITY_")}


class Embedded:
    def __init__(self, workdir: Path, config: Config, supervisor: Supervisor) -> None:
        self.workdir = workdir
        self.config = config
        self.supervisor = supervisor
        self.address = f"127.0.0.1:{config.global_scheduler.grpc_port}"

    def status(self) -> global_scheduler_pb2.ClusterStatus:
        with secure_channel(self.config, self.address) as channel:
            return global_scheduler_pb2_grpc.GlobalSchedulerStub(channel).GetClusterStatus(
                global_scheduler_pb2.GetClusterStatusRequest(), timeout=10)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    workdir = tmp_path_factory.mktemp("embedded")
    config = load_config(env={}, overrides={
        "cluster.state_dir": str(workdir / "state"),
        "global_scheduler.grpc_port": free_port(),
        "local_scheduler.virtual_gpus": 2,
    })
    assert credential_files(config).managed_dir is not None  # nothing configured
    supervisor = Supervisor(workdir / "logs")
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(FRESH_ENV)  # the daemons inherit no session credentials
    try:
        assert start_schedulers(config, 1, supervisor, threading.Event()) is not None
    except BaseException:
        supervisor.stop()
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield Embedded(workdir, config, supervisor)
    finally:
        supervisor.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_start_made_private_credentials_in_the_state_directory(
        embedded: Embedded) -> None:
    directory = embedded.workdir / "state" / "security"
    assert _mode(directory) == 0o700
    for name in ("ca-key.pem", "node-key.pem", "join-token"):
        assert _mode(directory / name) == 0o600, name
    assert (directory / "ca.pem").exists() and (directory / "node.pem").exists()


def _refusals(embedded: Embedded, tmp_path: Path) -> dict[str, Callable[[str], grpc.Channel]]:
    """Channels of clients without a certificate of this cluster."""
    material = load_tls(embedded.config)
    other = load_config(env={}, overrides={"cluster.state_dir": str(tmp_path / "other")})
    ensure_cluster_credentials(other)  # another cluster's CA and certificate
    return {
        "plain": lambda address: grpc.insecure_channel(address),
        "TLS without a client certificate": lambda address: grpc.secure_channel(
            address, grpc.ssl_channel_credentials(material.ca),
            options=[("grpc.ssl_target_name_override", "notebookos")]),
        "another cluster's certificate": lambda address: secure_channel(other, address),
    }


def test_clients_without_the_cluster_certificate_are_refused_in_the_handshake(
        embedded: Embedded, tmp_path: Path) -> None:
    (host,) = embedded.status().hosts
    token = JoinTokens(embedded.config).presented()
    invented = global_scheduler_pb2.RegisterHostRequest(
        host_id="intruder", address="127.0.0.1:1", instance_id="i",
        capacity=common_pb2.ResourceSpec(millicpus=8000, memory_mb=8192, gpus=8),
        gpus=[common_pb2.GpuDevice(device_id=i, name="fake", vram_gb=80) for i in range(8)])
    for name, make in _refusals(embedded, tmp_path).items():
        with make(embedded.address) as channel:
            gs = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
            for call, request, metadata in (
                    (gs.GetClusterStatus, global_scheduler_pb2.GetClusterStatusRequest(), None),
                    (gs.ListKernels, global_scheduler_pb2.ListKernelsRequest(), None),
                    # even with the join token: no certificate, no call
                    (gs.RegisterHost, invented, ((METADATA_KEY, token),))):
                with pytest.raises(grpc.RpcError) as caught:
                    call(request, timeout=5, metadata=metadata)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, (name, caught.value)
        with make(host.address) as channel:  # the Local Scheduler's port alike
            with pytest.raises(grpc.RpcError) as caught:
                local_scheduler_pb2_grpc.LocalSchedulerStub(channel).GetHostStatus(
                    local_scheduler_pb2.GetHostStatusRequest(), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, name
    with secure_channel(embedded.config, host.address) as channel:  # with it, it answers
        assert local_scheduler_pb2_grpc.LocalSchedulerStub(channel).GetHostStatus(
            local_scheduler_pb2.GetHostStatusRequest(), timeout=10).host.host_id == "host-0"
    assert [h.host_id for h in embedded.status().hosts] == ["host-0"]


def test_a_certificate_without_the_join_token_cannot_register_a_host(
        embedded: Embedded) -> None:
    token = JoinTokens(embedded.config).presented()
    before = embedded.status()
    invented = global_scheduler_pb2.RegisterHostRequest(
        host_id="intruder", address="127.0.0.1:1", instance_id="i",
        capacity=common_pb2.ResourceSpec(millicpus=8000, memory_mb=8192, gpus=8),
        gpus=[common_pb2.GpuDevice(device_id=i, name="fake", vram_gb=80) for i in range(8)])
    with secure_channel(embedded.config, embedded.address) as channel:
        gs = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        host_calls = (
            (gs.RegisterHost, invented),
            (gs.Heartbeat, global_scheduler_pb2.HeartbeatRequest(host_id="host-0")),
            (gs.DeregisterHost, global_scheduler_pb2.DeregisterHostRequest(host_id="host-0")),
            (gs.ReportReplicaEvent, global_scheduler_pb2.ReplicaEvent(host_id="host-0")),
        )
        for metadata, says in ((None, "no cluster join token was presented"),
                               (((METADATA_KEY, "w" * 43),), "is not the Global Scheduler's"),
                               (((METADATA_KEY, token[:-1]),), "is not the Global Scheduler's")):
            for call, request in host_calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call(request, timeout=5, metadata=metadata)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, call
                details = caught.value.details()
                assert says in details and "security.join_token_file" in details, details
                assert token not in details
        # the methods for users and tools need the certificate only
        gs.ListKernels(global_scheduler_pb2.ListKernelsRequest(), timeout=10)
    after = embedded.status()
    assert [h.host_id for h in after.hosts] == [h.host_id for h in before.hosts] == ["host-0"]
    assert after.gpus_total == before.gpus_total == 2


def _status_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "notebookos.cli", "status", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_status_works_for_the_user_with_the_files_and_says_what_is_missing(
        embedded: Embedded, tmp_path: Path) -> None:
    token = JoinTokens(embedded.config).presented()
    key = load_tls(embedded.config).key.decode()
    state = str(embedded.workdir / "state")
    ok = _status_cli("--state-dir", state, "--global-scheduler", embedded.address, "--json",
                     env=FRESH_ENV)
    assert ok.returncode == 0, ok.stderr
    assert '"host-0"' in ok.stdout
    # the cluster's state directory given by the environment works the same way
    ok = _status_cli("--global-scheduler", embedded.address,
                     env={**FRESH_ENV, "NOTEBOOKOS_CLUSTER_STATE_DIR": state})
    assert ok.returncode == 0 and "host-0" in ok.stdout, ok.stderr
    missing = _status_cli("--state-dir", str(tmp_path / "elsewhere"), "--global-scheduler",
                          embedded.address, env=FRESH_ENV)
    assert missing.returncode == 1
    assert "security.ca_file" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "elsewhere").exists()  # a client never makes credentials
    # never a token or a key in what the daemons log or status prints
    logs = "".join(p.read_text(errors="replace") for p in embedded.workdir.rglob("*.log"))
    assert logs, "no daemon logs found"
    secret_line = key.splitlines()[1]
    for text in (ok.stdout, ok.stderr, missing.stderr, logs):
        assert token not in text and secret_line not in text


def _listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of the TCP sockets those processes listen on, from /proc (psutil's
    address decoding breaks once pysyncobj has replaced socket.inet_ntop in this process)."""
    table: dict[str, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A":  # LISTEN
                    continue
                hex_ip, hex_port = local.split(":")
                raw = bytes.fromhex(hex_ip)
                if len(raw) == 4:
                    address = ".".join(str(b) for b in raw[::-1])
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    address = ipaddress.IPv6Address(words).compressed
                table[inode] = (address, int(hex_port, 16))
    found = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in table:
                found.append((pid, *table[target[8:-1]]))
    return found


def test_every_process_of_the_embedded_cluster_listens_on_loopback_only(
        embedded: Embedded) -> None:
    from notebookos.supervisor import marked_processes

    pids = marked_processes(embedded.supervisor.marker)
    assert len(pids) >= 2  # the Global Scheduler and the Local Scheduler, at least
    listening = _listening(pids)
    assert len({pid for pid, _, _ in listening}) >= 2, listening
    assert all(_loopback(ip) for _, ip, _ in listening), listening


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's view
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
