"""Where the Global Scheduler keeps its registry across restarts.

The registry is two maps of JSON documents: hosts by host id and kernels by kernel id (each
kernel with its key, front ports and replicas). ``FileRegistryStore`` (the embedded default)
keeps a JSON snapshot and a journal of changes beside it; ``RedisRegistryStore`` keeps two Redis
hashes.
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

    def close(self) -> None:  # noqa: B027 - optional
        """Release open files or connections; the registry stays where it is."""


def journal_path_of(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


def read_file_registry(path: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """(hosts, kernels) of a ``FileRegistryStore`` at ``path``: its snapshot with its journal
    replayed over it. Only reads (a running Global Scheduler may be writing it)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"registry file {path} is unreadable: {exc}") from exc
    tables: dict[str, dict] = {"hosts": dict(data.get("hosts", {})),
                               "kernels": dict(data.get("kernels", {}))}
    journal = journal_path_of(Path(path))
    try:
        lines = journal.read_bytes().split(b"\n")
    except FileNotFoundError:
        lines = []
    except OSError as exc:
        raise ValueError(f"registry journal {journal} is unreadable: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            change = json.loads(line)
            table = tables[change["table"]]
            if "doc" in change:
                table[change["id"]] = change["doc"]
            else:
                table.pop(change["id"], None)
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):
                continue  # torn by a crash before its newline: that change never returned
            raise ValueError(f"registry journal {journal} is unreadable at line {number}: "
                             f"{exc!r}") from exc
    return tables["hosts"], tables["kernels"]


class FileRegistryStore(RegistryStore):
    """A snapshot file and a journal beside it (``<path>.journal``, one JSON line a change).

    A change appends one line to the journal (one ``write``: no rename, so it costs tens of
    microseconds where rewriting the whole file cost 1-4 ms on ext4, most of it in the rename,
    on the kernel-start path, twice a start). When the journal outgrows the registry it is
    folded into a new snapshot (written aside and renamed over the old one) and emptied. A crash
    between the two leaves changes that replay over the snapshot that already holds them: every
    line is idempotent. A torn last line (a crash mid-write) is ignored; any other unreadable
    line refuses the registry with its place, as an unreadable snapshot does. Both files hold
    kernel keys: mode 0600.
    """

    COMPACT_MIN_LINES = 256

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.journal_path = journal_path_of(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._hosts, self._kernels = read_file_registry(self.path)
        self._journal_fd = -1
        self._journal_lines = 0
        self._compact()

    def _compact(self) -> None:
        """Fold the journal into a new snapshot, then empty it."""
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".registry-")
        with os.fdopen(fd, "w") as f:
            json.dump({"hosts": self._hosts, "kernels": self._kernels}, f)
        os.chmod(tmp, 0o600)  # holds kernel keys
        os.replace(tmp, self.path)
        if self._journal_fd < 0:
            self._journal_fd = os.open(self.journal_path,
                                       os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                                       0o600)
            os.fchmod(self._journal_fd, 0o600)
        os.ftruncate(self._journal_fd, 0)
        self._journal_lines = 0

    def _append(self, change: dict[str, Any]) -> None:
        line = (json.dumps(change, separators=(",", ":")) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self._journal_fd, view):]
        self._journal_lines += 1
        if self._journal_lines > max(self.COMPACT_MIN_LINES,
                                     2 * (len(self._hosts) + len(self._kernels))):
            self._compact()

    def load(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self._hosts), dict(self._kernels)

    def put_host(self, host_id: str, doc: dict) -> None:
        with self._lock:
            self._hosts[host_id] = doc
            self._append({"table": "hosts", "id": host_id, "doc": doc})

    def delete_host(self, host_id: str) -> None:
        with self._lock:
            if self._hosts.pop(host_id, None) is not None:
                self._append({"table": "hosts", "id": host_id})

    def put_kernel(self, kernel_id: str, doc: dict) -> None:
        with self._lock:
            self._kernels[kernel_id] = doc
            self._append({"table": "kernels", "id": kernel_id, "doc": doc})

    def delete_kernel(self, kernel_id: str) -> None:
        with self._lock:
            if self._kernels.pop(kernel_id, None) is not None:
                self._append({"table": "kernels", "id": kernel_id})

    def close(self) -> None:
        with self._lock:
            if self._journal_fd >= 0:
                os.close(self._journal_fd)
                self._journal_fd = -1


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
