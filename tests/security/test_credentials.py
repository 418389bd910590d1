"""The cluster's credentials: made once with safe modes, loaded with messages that name the
setting to check, mutual TLS that refuses clients without a cluster certificate, and the join
token interceptor (in-process gRPC servers; the daemons are tested in tests/security/test_up.py
and tests/schedulers/test_fuzz.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from notebookos.config import ConfigError, load_config
from notebookos.proto import global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.security import (
    METADATA_KEY,
    AioJoinTokenInterceptor,
    JoinTokenInterceptor,
    JoinTokens,
    SecurityError,
    add_secure_port,
    child_environment,
    create_credentials,
    credential_files,
    ensure_cluster_credentials,
    load_tls,
    pki,
    secure_aio_channel,
    secure_channel,
)

NO_SECURITY_ENV = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOKOS_")}


def config_in(state_dir: Path, **security: str):  # noqa: ANN201 - a Config
    overrides = {"cluster.state_dir": str(state_dir)}
    overrides.update({f"security.{k}": v for k, v in security.items()})
    return load_config(env={}, overrides=overrides)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_start_makes_private_files_once(tmp_path: Path) -> None:
    config = config_in(tmp_path / "state")
    files = ensure_cluster_credentials(config)
    directory = tmp_path / "state" / "security"
    assert files.managed_dir == directory.absolute()
    assert mode(directory) == 0o700
    for private in ("ca-key.pem", "node-key.pem", "join-token"):
        assert mode(directory / private) == 0o600, private
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    ensure_cluster_credentials(config)  # a second start changes nothing
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    material = load_tls(config)
    assert b"PRIVATE KEY" in material.key and b"CERTIFICATE" in material.cert
    assert "notebookos" in pki.describe(material.cert)


def test_a_configured_deployment_gets_nothing_created_and_a_message_naming_the_setting(
        tmp_path: Path) -> None:
    config = config_in(tmp_path, ca_file=str(tmp_path / "nope" / "ca.pem"),
                       cert_file=str(tmp_path / "nope" / "c.pem"),
                       key_file=str(tmp_path / "nope" / "k.pem"))
    with pytest.raises(SecurityError, match=r"security\.ca_file \(\$NOTEBOOKOS_SECURITY_CA_FILE"):
        ensure_cluster_credentials(config)
    assert not (tmp_path / "nope").exists()


def test_mismatched_files_are_refused_with_the_settings_to_check(tmp_path: Path) -> None:
    create_credentials(tmp_path / "a" / "security")
    create_credentials(tmp_path / "b" / "security")
    a, b = tmp_path / "a" / "security", tmp_path / "b" / "security"
    with pytest.raises(SecurityError, match="does not belong to the certificate"):
        load_tls(config_in(tmp_path, ca_file=str(a / "ca.pem"), cert_file=str(a / "node.pem"),
                           key_file=str(b / "node-key.pem")))
    with pytest.raises(SecurityError, match="not signed by a CA in"):
        load_tls(config_in(tmp_path, ca_file=str(a / "ca.pem"), cert_file=str(b / "node.pem"),
                           key_file=str(b / "node-key.pem")))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(SecurityError, match=r"holds no PEM certificate"):
        load_tls(config_in(tmp_path, ca_file=str(tmp_path / "junk.pem"),
                           cert_file=str(a / "node.pem"), key_file=str(a / "node-key.pem")))
    # a CA bundle of two CAs (while rotating) trusts certificates of either
    (tmp_path / "bundle.pem").write_bytes((a / "ca.pem").read_bytes() + (b / "ca.pem").read_bytes())
    load_tls(config_in(tmp_path, ca_file=str(tmp_path / "bundle.pem"),
                       cert_file=str(b / "node.pem"), key_file=str(b / "node-key.pem")))


def test_child_environment_points_children_at_the_same_files(tmp_path: Path) -> None:
    config = config_in(tmp_path / "state")
    ensure_cluster_credentials(config)
    env = child_environment(config)
    child = load_config(env=env)
    assert credential_files(child).ca == credential_files(config).ca
    assert credential_files(child).managed_dir is None  # children never create credentials
    assert JoinTokens(child).presented() == JoinTokens(config).presented()
    assert JoinTokens(config).presented() not in json.dumps(env)  # a path, not the token


def test_tokens_are_never_printed(tmp_path: Path) -> None:
    token = "s3cr3t-join-token-0123456789"
    env = {**NO_SECURITY_ENV, "NOTEBOOKOS_SECURITY_JOIN_TOKEN": token,
           "NOTEBOOKOS_JUPYTER_TOKEN": "jupyter-token-abcdef", "PATH": os.environ["PATH"]}
    for args in (["config", "show"], ["config", "show", "--json"]):
        out = subprocess.run([sys.executable, "-m", "notebookos.cli", *args], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert token not in out.stdout and "jupyter-token-abcdef" not in out.stdout
        assert "********" in out.stdout
    with pytest.raises(ConfigError) as caught:  # a bad token is refused without echoing it
        load_config(env={"NOTEBOOKOS_SECURITY_JOIN_TOKEN": "short-secret"})
    assert "short-secret" not in str(caught.value) and "security.join_token" in str(caught.value)


def test_rotate_token_keeps_the_old_one_accepted_until_finished(tmp_path: Path) -> None:
    config = config_in(tmp_path / "state")
    ensure_cluster_credentials(config)
    gs_side = JoinTokens(config)
    old = gs_side.presented()
    cmd = [sys.executable, "-m", "notebookos.cli", "security", "--state-dir",
           str(tmp_path / "state")]
    out = subprocess.run([*cmd, "rotate-token"], capture_output=True, text=True, timeout=60,
                         env=NO_SECURITY_ENV)
    assert out.returncode == 0, out.stderr
    assert old not in out.stdout
    new = gs_side.presented()
    assert new != old and gs_side.accepts(old) and gs_side.accepts(new)  # re-read on change
    subprocess.run([*cmd, "rotate-token", "--finish"], check=True, capture_output=True,
                   timeout=60, env=NO_SECURITY_ENV)
    assert gs_side.accepts(new) and not gs_side.accepts(old)
    assert not gs_side.accepts("") and not gs_side.accepts(None)


class _Status(global_scheduler_pb2_grpc.GlobalSchedulerServicer):
    def GetClusterStatus(self, request, context):  # noqa: N802
        return global_scheduler_pb2.ClusterStatus(policy="ok")

    def RegisterHost(self, request, context):  # noqa: N802
        return global_scheduler_pb2.RegisterHostResponse(heartbeat_interval_s=1.0)


@pytest.fixture
def tls_server(tmp_path: Path):  # noqa: ANN201
    config = config_in(tmp_path / "state")
    ensure_cluster_credentials(config)
    server = grpc.server(futures.ThreadPoolExecutor(2),
                         interceptors=[JoinTokenInterceptor(config)])
    global_scheduler_pb2_grpc.add_GlobalSchedulerServicer_to_server(_Status(), server)
    port = add_secure_port(server, config, "127.0.0.1:0")
    server.start()
    yield config, f"127.0.0.1:{port}"
    server.stop(None)


def _status(channel: grpc.Channel) -> str:
    return global_scheduler_pb2_grpc.GlobalSchedulerStub(channel).GetClusterStatus(
        global_scheduler_pb2.GetClusterStatusRequest(), timeout=5).policy


def test_only_clients_with_a_cluster_certificate_complete_the_handshake(tls_server,
                                                                        tmp_path: Path) -> None:
    config, address = tls_server
    with secure_channel(config, address) as channel:
        assert _status(channel) == "ok"
    other = config_in(tmp_path / "other")
    ensure_cluster_credentials(other)  # another cluster's CA
    material = load_tls(config)
    attempts = {
        "plain": grpc.insecure_channel(address),
        "TLS, no client certificate": grpc.secure_channel(
            address, grpc.ssl_channel_credentials(material.ca),
            options=[("grpc.ssl_target_name_override", "notebookos")]),
        "another cluster's certificate": secure_channel(other, address),
    }
    for name, channel in attempts.items():
        with channel, pytest.raises(grpc.RpcError) as caught:
            _status(channel)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, name


def test_registration_needs_the_join_token(tls_server) -> None:
    config, address = tls_server
    token = JoinTokens(config).presented()
    request = global_scheduler_pb2.RegisterHostRequest(host_id="h", address="127.0.0.1:1")
    with secure_channel(config, address) as channel:
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        for metadata, says in ((None, "no cluster join token was presented"),
                               (((METADATA_KEY, "x" * 43),), "is not the Global Scheduler's")):
            with pytest.raises(grpc.RpcError) as caught:
                stub.RegisterHost(request, timeout=5, metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert says in caught.value.details()
            assert "security.join_token_file" in caught.value.details()
            assert token not in caught.value.details()
        ok = stub.RegisterHost(request, timeout=5, metadata=((METADATA_KEY, token),))
        assert ok.heartbeat_interval_s == 1.0
        assert _status(channel) == "ok"  # other methods need no token


def test_the_aio_server_and_channel_speak_the_same_tls_and_check_the_token(
        tmp_path: Path) -> None:
    config = config_in(tmp_path / "state")
    ensure_cluster_credentials(config)
    token = JoinTokens(config).presented()

    async def main() -> None:
        server = grpc.aio.server(interceptors=[AioJoinTokenInterceptor(config)])
        global_scheduler_pb2_grpc.add_GlobalSchedulerServicer_to_server(_Status(), server)
        port = add_secure_port(server, config, "127.0.0.1:0")
        await server.start()
        try:
            async with secure_aio_channel(config, f"127.0.0.1:{port}") as channel:
                stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
                request = global_scheduler_pb2.RegisterHostRequest(host_id="h")
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.RegisterHost(request, timeout=5)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
                await stub.RegisterHost(request, timeout=5, metadata=((METADATA_KEY, token),))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as plain:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await global_scheduler_pb2_grpc.GlobalSchedulerStub(plain).GetClusterStatus(
                        global_scheduler_pb2.GetClusterStatusRequest(), timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_server_serves_a_replaced_certificate_without_a_restart(tls_server,
                                                                   tmp_path: Path) -> None:
    config, address = tls_server
    directory = credential_files(config).managed_dir
    assert directory is not None
    old = (directory / "node.pem").read_bytes()
    (directory / "node.pem").unlink()
    (directory / "node-key.pem").unlink()
    create_credentials(directory)  # a new certificate from the same CA
    assert (directory / "node.pem").read_bytes() != old
    assert served_certificate(config, address) == (directory / "node.pem").read_bytes()
    with secure_channel(config, address) as channel:  # a new connection: a new handshake
        assert _status(channel) == "ok"


def served_certificate(config, address: str) -> bytes:  # noqa: ANN001
    """The certificate a TLS server presents, as PEM (a handshake with Python's ssl)."""
    files = credential_files(config)
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="notebookos") as tls:
        der = tls.getpeercert(binary_form=True)
    return ssl.DER_cert_to_PEM_cert(der).encode()


@pytest.mark.parametrize("daemon", ["local-scheduler", "global-scheduler"])
def test_a_daemon_without_usable_credentials_says_which_setting_to_check(
        daemon: str, tmp_path: Path) -> None:
    env = {**NO_SECURITY_ENV, "NOTEBOOKOS_SECURITY_CA_FILE": str(tmp_path / "missing-ca.pem"),
           "NOTEBOOKOS_SECURITY_CERT_FILE": str(tmp_path / "missing.pem"),
           "NOTEBOOKOS_SECURITY_KEY_FILE": str(tmp_path / "missing-key.pem"),
           "NOTEBOOKOS_SECURITY_JOIN_TOKEN": "a-join-token-long-enough"}
    out = subprocess.run([sys.executable, "-m", "notebookos.cli", daemon, "--port", "0",
                          "--state-dir", str(tmp_path / "state")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert "security.ca_file" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "a-join-token-long-enough" not in out.stderr
    no_token = subprocess.run(
        [sys.executable, "-m", "notebookos.cli", "local-scheduler", "--port", "0",
         "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=60,
        env={**NO_SECURITY_ENV, "NOTEBOOKOS_SECURITY_JOIN_TOKEN_FILE": str(tmp_path / "none")})
    assert no_token.returncode != 0 and "security.join_token_file" in no_token.stderr


def test_a_channel_reaches_a_restarted_peer_within_two_seconds(tmp_path: Path) -> None:
    """A daemon's channel outlives its peer's restarts. With gRPC's default backoff (1 s, x1.6,
    up to 120 s) a Local Scheduler that had seen five Global Scheduler restarts in a row took
    longer than the heartbeat timeout to connect again, and the restarted scheduler removed
    the healthy host (benchmarks/chaos.py, burst-global-scheduler). The project's channels
    back off at most 2 s."""
    import time

    from notebookos.ports import free_ports

    config = config_in(tmp_path / "state")
    ensure_cluster_credentials(config)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    with secure_channel(config, address) as channel:
        down_until = time.monotonic() + 10  # the peer is down 10 s: gRPC's default backoff
        while time.monotonic() < down_until:  # would next try at 15.9 s, ours within 2 s
            with pytest.raises(grpc.RpcError):
                _status(channel)
            time.sleep(0.5)
        server = grpc.server(futures.ThreadPoolExecutor(2))
        global_scheduler_pb2_grpc.add_GlobalSchedulerServicer_to_server(_Status(), server)
        add_secure_port(server, config, address)
        server.start()
        try:
            started = time.monotonic()
            while True:
                try:
                    assert _status(channel) == "ok"
                    break
                except grpc.RpcError:
                    assert time.monotonic() - started < 5, "the channel did not reconnect"
                    time.sleep(0.05)
            assert time.monotonic() - started < 2.5
        finally:
            server.stop(None)
