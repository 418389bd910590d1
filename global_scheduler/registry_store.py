"""Where the Global Scheduler keeps its registry across restarts.

The registry is two maps of JSON documents: hosts by host id and kernels by kernel id (each
kernel with its key, front ports and replicas). ``FileRegistryStore`` (the embedded default)
rewrites one JSON file atomically; ``RedisRegistryStore`` keeps two Redis hashes.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class RegistryStore(ABC):
    @abstractmethod
    def load(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(hosts, kernels) as saved."""

    @abstractmethod
    def put_host(self, host_id: str, doc: dict[str, Any]) -> None: ...

    @abstractmethod
    def delete_host(self, host_id: str) -> None: ...

    @abstractmethod
    def put_kernel(self, kernel_id: str, doc: dict[str, Any]) -> None: ...

    @abstractmethod
    def delete_kernel(self, kernel_id: str) -> None: ...


class FileRegistryStore(RegistryStore):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._hosts, self._kernels = self._read()

    def _read(self) -> tuple[dict, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}, {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"registry file {self.path} is unreadable: {exc}") from exc
        return dict(data.get("hosts", {})), dict(data.get("kernels", {}))

    def _write(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".registry-")
        with os.fdopen(fd, "w") as f:
            json.dump({"hosts": self._hosts, "kernels": self._kernels}, f)
        os.chmod(tmp, 0o600)  # holds kernel keys
        os.replace(tmp, self.path)

    def load(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self._hosts), dict(self._kernels)

    def put_host(self, host_id: str, doc: dict) -> None:
        with self._lock:
            self._hosts[host_id] = doc
            self._write()

    def delete_host(self, host_id: str) -> None:
        with self._lock:
            if self._hosts.pop(host_id, None) is not None:
                self._write()

    def put_kernel(self, kernel_id: str, doc: dict) -> None:
        with self._lock:
            self._kernels[kernel_id] = doc
            self._write()

    def delete_kernel(self, kernel_id: str) -> None:
        with self._lock:
            if self._kernels.pop(kernel_id, None) is not None:
                self._write()


class RedisRegistryStore(RegistryStore):
    def __init__(self, url: str, prefix: str = "notebookos:registry") -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.hosts_key = f"{prefix}:hosts"
        self.kernels_key = f"{prefix}:kernels"

    def load(self) -> tuple[dict, dict]:
        def read(key: str) -> dict:
            return {k.decode(): json.loads(v) for k, v in self.client.hgetall(key).items()}

        return read(self.hosts_key), read(self.kernels_key)

    def put_host(self, host_id: str, doc: dict) -> None:
        self.client.hset(self.hosts_key, host_id, json.dumps(doc))

    def delete_host(self, host_id: str) -> None:
        self.client.hdel(self.hosts_key, host_id)

    def put_kernel(self, kernel_id: str, doc: dict) -> None:
        self.client.hset(self.kernels_key, kernel_id, json.dumps(doc))

    def delete_kernel(self, kernel_id: str) -> None:
        self.client.hdel(self.kernels_key, kernel_id)
