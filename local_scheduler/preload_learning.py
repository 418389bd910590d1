"""The host learns what to preload: installed packages its replicas' cells imported are imported
by the fork server (and the prewarm pool's interpreters) while the host is idle, so the replicas
started, replaced or woken afterwards are forked holding them (issue 34).

Without it, a hibernated notebook that used torch woke into replicas that imported torch before
its next cell could run (2.5 s on an idle 2-core VM, 9.9 s loaded) unless the operator had set
``local_scheduler.preload_modules=torch`` (about 1 s). Now the first notebook on the host that
imports torch teaches it.

Replicas append the top-level modules their cells imported to a file in the launcher's folder
(``notebookos.import_report``, after each cell: no replica polls). ``PreloadLearner`` reads it
on each of the host's heartbeats (``tick``: a size check when nothing was reported; no timer of
its own) and keeps a name only if it is

- an installed library module: a top-level name found under the standard library or
  site-packages, never in a notebook's folder (``notebookos.library_paths.refusal``; the fork
  server checks again before it imports);
- allowed: not in ``local_scheduler.learn_preload_deny``, in ``learn_preload_allow`` when that is
  set;
- within ``learn_preload_max`` learned names (the configured ``preload_modules`` do not count).

Once no replica was launched for ``IDLE_S`` it asks the fork server to import the names kept
(``ForkServer.import_modules``, on a thread of its own while it runs: the heartbeat goes on). A failed import is logged and never retried in this run; an
import that leaves a thread running makes the server unsafe to fork: the module is dropped and
the server restarted without it. The server's resident memory after each import is logged and
kept in ``preload-learned.json`` (next to the report): forked replicas share those pages
copy-on-write. Then ``on_learned`` runs (the daemon renews its prewarm pool, whose waiting
replicas were forked before). A server started later (a restart) imports the learned names at
its start, as the pool's new interpreters do (``prewarm_main.PRELOAD_ENV``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from notebookos.library_paths import refusal
from notebookos.local_scheduler.fork_server import ForkServer, ForkServerError

log = logging.getLogger(__name__)

REPORT_FILE = "imported-modules"
STATUS_FILE = "preload-learned.json"
IDLE_S = 1.0  # no replica launched for this long: the host is idle enough to import
MAX_REPORT_LINE = 200


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


@dataclass(frozen=True)
class LearnSettings:
    enabled: bool = True
    max_modules: int = 8
    deny: frozenset[str] = frozenset({"debugpy"})
    allow: frozenset[str] = frozenset()  # empty: any installed package

    @classmethod
    def of(cls, ls) -> LearnSettings:  # noqa: ANN001 - config.LocalSchedulerSettings
        return cls(ls.learn_preload, ls.learn_preload_max, _names(ls.learn_preload_deny),
                   _names(ls.learn_preload_allow))


class PreloadLearner:
    """Reads the replicas' import reports and has the fork server import what it keeps."""

    def __init__(self, settings: LearnSettings, workdir: Path, fork_server: ForkServer | None,
                 idle: Callable[[], bool] = lambda: True,
                 on_learned: Callable[[], None] | None = None,
                 configured: list[str] | None = None) -> None:
        self.settings = settings
        self.report_path = Path(workdir) / REPORT_FILE
        self.status_path = Path(workdir) / STATUS_FILE
        self.fork_server = fork_server
        self.idle = idle
        self.on_learned = on_learned
        self.configured = set(configured or ())
        self.learned: list[str] = []
        self.failed: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self.pending: list[str] = []
        self.fork_server_rss_kb = 0
        self._offset = 0
        self._partial = b""
        self._full_said = False
        self._closed = threading.Event()
        self._lock = threading.RLock()  # consider() saves the status under it
        self._importing = False  # an import_pending thread runs

    def start(self) -> None:
        """Nothing runs of its own: the host's heartbeat calls ``tick``."""

    def close(self) -> None:
        self._closed.set()

    def tick(self) -> None:
        """On each heartbeat: read what was reported (cheap), and import what was kept on a
        thread of its own when the host is idle (an import of torch takes seconds)."""
        if self._closed.is_set() or not self.settings.enabled:
            return
        try:
            if not self._consider_reported():
                return
            with self._lock:
                if self._importing or not (self.pending and self.idle()):
                    return
                self._importing = True
        except Exception:  # noqa: BLE001 - learning is an optimisation: never hurt the host
            log.exception("preload learning failed")
            return

        def run() -> None:
            try:
                self.import_pending()
            except Exception:  # noqa: BLE001
                log.exception("preload learning failed")
            finally:
                with self._lock:
                    self._importing = False

        threading.Thread(target=run, daemon=True, name="preload-import").start()

    def poll(self) -> None:
        """Read what the replicas reported since the last call; import what was kept when
        the host is idle, here. Nothing while the fork server is not up: what it holds (not to
        be learned) is known once it is, and an import it cannot take would be dropped."""
        if self._consider_reported() and self.pending and self.idle():
            self.import_pending()

    def _consider_reported(self) -> bool:
        """Consider what was reported since the last call; False while the fork server is
        not up (then nothing is read)."""
        if self.fork_server is not None and not self.fork_server.alive:
            return False
        for name in self._read_report():
            self.consider(name)
        return True

    def _read_report(self) -> list[str]:
        try:
            if os.stat(self.report_path).st_size <= self._offset:
                return []  # nothing new: the usual heartbeat
            with open(self.report_path, "rb") as f:
                f.seek(self._offset)
                data = f.read(1 << 20)
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()[-MAX_REPORT_LINE:]
        return [line.decode("utf-8", "replace").strip()[:MAX_REPORT_LINE]
                for line in lines if line.strip()]

    def consider(self, name: str) -> None:
        """Keep ``name`` for the next import, or refuse it (said once per name)."""
        with self._lock:
            loaded = self.fork_server.loaded if self.fork_server is not None else set()
            if (name in self.configured or name in loaded or name in self.learned
                    or name in self.pending or name in self.failed or name in self.refused):
                return
            s = self.settings
            why = ("denied by local_scheduler.learn_preload_deny" if name in s.deny else
                   "not in local_scheduler.learn_preload_allow" if s.allow and name not in s.allow
                   else refusal(name))
            if why is not None:
                self.refused[name] = why
                log.log(logging.INFO if name in s.deny or s.allow else logging.WARNING,
                        "not preloading %r, which a replica imported: %s", name, why)
                self._save()
                return
            if len(self.learned) + len(self.pending) >= s.max_modules:
                if not self._full_said:
                    self._full_said = True
                    log.warning("not preloading %r: %d learned modules already "
                                "(local_scheduler.learn_preload_max); later ones are not "
                                "preloaded either", name, s.max_modules)
                return
            self.pending.append(name)
            log.info("a replica imported %r: the fork server imports it once the host is idle",
                     name)

    def import_pending(self) -> None:
        with self._lock:
            names, self.pending = self.pending, []
        if self.fork_server is None:  # the pool's new interpreters import them at their start
            self._learned(names)
            return
        try:
            answer = self.fork_server.import_modules(names)
        except ForkServerError as exc:
            log.warning("the fork server did not preload %s: %s", ", ".join(names), exc)
            with self._lock:
                for name in names:
                    self.failed[name] = str(exc)
            self._save()
            return
        imported = [n for n in names if n in (answer.get("imported") or {})]
        failed = {n: str(why) for n, why in (answer.get("failed") or {}).items()}
        before = int(answer.get("rss_before_kb") or 0)
        self.fork_server_rss_kb = int(answer.get("rss_kb") or 0)
        for name, why in failed.items():
            log.warning("the fork server could not preload %r: %s (not tried again)", name, why)
        with self._lock:
            self.failed.update(failed)
        if answer.get("unsafe"):
            # the module that started a thread and any after it are dropped with the server
            imported = [n for n in imported if n not in failed]
            self._learned(imported, restart=True)
            return
        if imported:
            log.info("the fork server preloaded %s (%s); its resident memory is %d MiB (%+d), "
                     "shared copy-on-write with the replicas forked from it",
                     ", ".join(imported),
                     ", ".join(f"{answer['imported'][n]:.2f} s" for n in imported),
                     self.fork_server_rss_kb >> 10,
                     (self.fork_server_rss_kb - before) >> 10)
        self._learned(imported)

    def _learned(self, names: list[str], restart: bool = False) -> None:
        with self._lock:
            self.learned.extend(n for n in names if n not in self.learned)
            learned = list(self.learned)
        if self.fork_server is not None:
            self.fork_server.learned = learned
            if restart:
                log.warning("restarting the fork server without the modules that started "
                            "threads; it imports %s", ", ".join(learned) or "nothing learned")
                self.fork_server.restart()
        self._save()
        if (names or restart) and self.on_learned is not None:
            self.on_learned()

    def status(self) -> dict:
        with self._lock:
            return {"learned": list(self.learned), "failed": dict(self.failed),
                    "refused": dict(self.refused), "pending": list(self.pending),
                    "fork_server_rss_mb": self.fork_server_rss_kb >> 10}

    def _save(self) -> None:
        """``preload-learned.json``: what an operator (and a test) reads."""
        tmp = self.status_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.status(), indent=1))
            os.replace(tmp, self.status_path)
        except OSError as exc:
            log.debug("cannot write %s: %s", self.status_path, exc)


def idle_for(last_launch: Callable[[], float], seconds: float = IDLE_S) -> Callable[[], bool]:
    return lambda: time.monotonic() - last_launch() >= seconds
