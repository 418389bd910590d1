"""The Local Scheduler's side of the fork server (``fork_server_main``): start it, hand it
orders, and follow the replicas it forks, started at once or waiting in the prewarm pool.

A forked replica is the fork server's child, not the Local Scheduler's: ``ForkedProcess`` is what
the launcher needs of a ``subprocess.Popen`` (pid, poll, wait, returncode), fed by the server's
exit notices. One thread per server reads its answers. If the server dies, its replicas die with
it (``PR_SET_PDEATHSIG``): each is reported exited (-9), and the launcher starts a new server.

``import_modules`` has the server import packages the host learned its replicas use
(``preload_learning``); a server started afterwards imports them at its start
(``prewarm_main.PRELOAD_ENV``, with the configured ``preload_modules``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from notebookos.local_scheduler import spawn
from notebookos.local_scheduler.pid_watch import WatchedProcess, open_pidfd
from notebookos.local_scheduler.prewarm_main import PRELOAD_ENV

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
ORDER_TIMEOUT_S = 10.0
# the longest an ``import`` order may take (torch: 1.5 s on an idle 2-core VM, 10 s loaded);
# a fork ordered meanwhile waits for it as long (it is forked with the modules, as it should)
IMPORT_TIMEOUT_S = 120.0


class ForkServerError(OSError):
    """The fork server could not start or fork a replica (the launcher starts it cold)."""


class ForkedProcess:
    """A replica the fork server forked, as the launcher sees a ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()
        self._callbacks: list[Callable[[int], None]] = []
        self._callbacks_lock = threading.Lock()

    def poll(self) -> int | None:
        return self.returncode

    def add_exit_callback(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` once it has exited (at once when it has)."""
        with self._callbacks_lock:
            if self.returncode is None:
                self._callbacks.append(callback)
                return
        callback(self.returncode)

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"replica pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def exited(self, code: int) -> None:
        with self._callbacks_lock:
            if self.returncode is not None:
                return
            self.returncode = code
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(code)
            except Exception:  # noqa: BLE001 - the server's reader must go on
                log.exception("exit callback failed for pid %d", self.pid)


class ForkServer:
    """One ``fork_server_main`` process and the replicas it forked."""

    def __init__(self, python: str, module: str, log_path: Path) -> None:
        self.python = python
        self.module = module
        self.log_path = Path(log_path)
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one order written and answered at a time
        self._answers: dict[str, Future] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._children_lock = threading.Lock()
        self._orders = 0
        self._closed = False
        self._starting = False
        self._settled = threading.Event()  # set while no start is in progress
        self._settled.set()
        # imported at the server's start besides the configured preload_modules (learned ones)
        self.learned: list[str] = []
        self.loaded: set[str] = set()  # the top-level modules the server said it holds
        self._importing = 0  # import orders unanswered

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def importing(self) -> bool:
        """An ``import`` order is unanswered: a fork or a promotion would wait behind it."""
        return self._importing > 0

    def start_in_background(self) -> None:
        """Start the server on a thread of its own, unless it runs, starts or was closed."""
        with self._lock:
            if self._starting or self._closed or self.alive:
                return
            self._starting = True
            self._settled.clear()

        def run() -> None:
            try:
                self.start()
            except OSError as exc:
                log.warning("replicas start as new interpreters: %s", exc)
            finally:
                with self._lock:
                    self._starting = False
                    self._settled.set()

        threading.Thread(target=run, daemon=True, name="fork-server-start").start()

    def fork_or_none(self, argv: list[str], env: dict[str, str],
                     log_path: Path) -> ForkedProcess | None:
        """``fork``, or None when the server is not up (it is started again meanwhile)."""
        try:
            return self.fork(argv, env, log_path)
        except ForkServerError as exc:
            return self._unavailable("a replica", exc)

    def waiting_or_none(self) -> ForkedPrewarmed | None:
        """``fork_waiting`` once a start in progress is over, or None when the server is not up
        (it is started again meanwhile)."""
        self._settled.wait(READY_TIMEOUT_S)
        try:
            return self.fork_waiting()
        except ForkServerError as exc:
            return self._unavailable("a prewarmed replica", exc)

    def _unavailable(self, what: str, exc: ForkServerError) -> None:
        """``what`` starts as a new interpreter: said when the server runs but failed it (a
        server that is down was said so when it went); the server is started again."""
        if self.alive:
            log.warning("%s starts as a new interpreter: %s", what, exc)
        self.start_in_background()

    def start(self) -> None:
        """Start the server and wait until its imports are done; ForkServerError if it fails."""
        preload = [n for n in os.environ.get(PRELOAD_ENV, "").split(",") if n.strip()]
        env = {**os.environ, PRELOAD_ENV: ",".join([*preload, *self.learned])}
        with open(self.log_path, "ab") as log_file:
            process = spawn.popen(
                [self.python, "-m", "notebookos.local_scheduler.fork_server_main", self.module],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, env=env)
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], READY_TIMEOUT_S)
        line = process.stdout.readline() if readable else b""
        try:
            ready = json.loads(line)
            ok = ready.get("ready") is True
            self.loaded = set(ready.get("modules") or ())
        except (ValueError, AttributeError, TypeError):
            ok = False
        if not ok:
            _kill(process)
            raise ForkServerError(f"the fork server did not start (see {self.log_path})")
        with self._lock:
            if self._closed:
                _kill(process)
                raise ForkServerError("the launcher closed")
            self._process = process
        threading.Thread(target=self._read, args=(process,), daemon=True,
                         name="fork-server").start()

    def fork(self, argv: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        """Fork a replica running ``MODULE argv`` with ``env`` added, its output to
        ``log_path``. Raises ForkServerError when the server is gone or does not answer."""
        return self._order({"argv": argv, "env": env, "log": str(log_path)})

    def fork_waiting(self) -> ForkedPrewarmed:
        """Fork a prewarmed replica for the pool: it waits for ``promote``."""
        return ForkedPrewarmed(self, self._order({"wait": True}))

    def promote(self, pid: int, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        """Hand waiting child ``pid`` its order (``fork``'s arguments)."""
        self._order({"promote": pid, "argv": argv, "env": env, "log": str(log_path)})

    def import_modules(self, names: list[str]) -> dict:
        """Have the server import ``names`` (installed top-level packages), so the replicas it
        forks afterwards hold them; its answer (``fork_server_main``: imported, failed, unsafe,
        rss_kb). Raises ForkServerError when it is not running or does not answer in
        IMPORT_TIMEOUT_S."""
        answer = self._send({"import": list(names)}, importing=True)
        try:
            doc = answer.result(timeout=IMPORT_TIMEOUT_S)
        except TimeoutError:
            raise ForkServerError(f"the fork server did not import {names} in "
                                  f"{IMPORT_TIMEOUT_S:g} s") from None
        finally:
            with self._lock:
                self._importing -= 1
        self.loaded.update(doc.get("modules") or doc.get("imported") or ())
        return doc

    def modules(self) -> list[str]:
        """The top-level modules the server holds now (asked of it)."""
        return list(self._send({"modules": True}).result(timeout=ORDER_TIMEOUT_S)["modules"])

    def _send(self, order: dict, importing: bool = False) -> Future:
        """Write ``order``; the future of its answer document (not waited for here)."""
        with self._lock:
            tag, answer = self._write_order(order)
            answer.add_done_callback(lambda _f: self._answers.pop(tag, None))
            if importing:
                self._importing += 1
            return answer

    def _write_order(self, order: dict) -> tuple[str, Future]:
        """Write ``order`` under a new tag (lock held); the tag and its answer's future."""
        process = self._process
        if process is None or process.poll() is not None or process.stdin is None:
            raise ForkServerError("the fork server is not running")
        self._orders += 1
        tag = str(self._orders)
        answer: Future = Future()
        self._answers[tag] = answer
        try:
            process.stdin.write(json.dumps({"tag": tag, **order}).encode() + b"\n")
            process.stdin.flush()
        except (OSError, ValueError) as exc:
            self._answers.pop(tag, None)
            raise ForkServerError(f"the fork server is gone: {exc}") from None
        return tag, answer

    def _order(self, order: dict) -> ForkedProcess:
        with self._lock:
            tag, answer = self._write_order(order)
            try:  # behind an import the server is doing: forked once it is done
                return answer.result(timeout=ORDER_TIMEOUT_S +
                                     (IMPORT_TIMEOUT_S if self._importing else 0.0))
            except TimeoutError:
                raise ForkServerError("the fork server did not answer") from None
            finally:
                self._answers.pop(tag, None)

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                log.warning("fork server: unreadable answer %r", line[:200])
                continue
            if "exited" in doc:
                with self._children_lock:
                    child = self._children.pop(doc["exited"], None)
                if child is not None:
                    child.exited(doc["code"])
                continue
            answer = self._answers.get(str(doc.get("tag")))
            if "pid" in doc:
                with self._children_lock:  # a promoted child is known already
                    child = self._children.setdefault(doc["pid"], ForkedProcess(doc["pid"]))
                if answer is not None:
                    answer.set_result(child)
                else:  # its order timed out meanwhile: nobody will watch it
                    spawn.signal_group(child.pid, signal.SIGKILL)
            elif answer is not None and "error" not in doc:
                answer.set_result(doc)  # an import's or a question's answer
            elif answer is not None:
                answer.set_exception(ForkServerError(f"the fork server could not fork: "
                                                     f"{doc.get('error')}"))
            else:
                log.warning("fork server: %s", doc.get("error"))
        process.stdout.close()
        process.wait()
        if not self._closed:
            log.warning("the fork server exited (code %s); the replicas it forked live on",
                        process.returncode)
        for answer in list(self._answers.values()):
            if not answer.done():
                answer.set_exception(ForkServerError("the fork server exited"))
        with self._children_lock:
            children, self._children = self._children, {}
        for child in children.values():
            # a child waiting in the pool died with the server (PR_SET_PDEATHSIG: SIGKILL); a
            # replica outlives it (spawn.become_replica) and is watched through a pidfd now
            pidfd = open_pidfd(child.pid)
            if pidfd is None:
                child.exited(-9)
                continue
            threading.Thread(target=_watch_orphan, args=(child, pidfd), daemon=True,
                             name=f"watch-pid-{child.pid}").start()

    def restart(self) -> None:
        """Replace the server by a new one (its ``learned`` changed): waiting children die with
        it, replicas it forked live on (``spawn.become_replica``)."""
        with self._lock:
            process = self._process
        if process is not None:
            _kill(process)
        self.start_in_background()

    def close(self) -> None:
        """Stop the server (its replicas die with it: stop them first)."""
        with self._lock:
            self._closed = True
            process = self._process
        if process is not None:
            _kill(process)


class ForkedPrewarmed:
    """A forked replica waiting in the prewarm pool (``prewarm.Prewarmed``)."""

    def __init__(self, server: ForkServer, process: ForkedProcess) -> None:
        self.server = server
        self.process = process

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def promote(self, argv: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        self.server.promote(self.process.pid, argv, env, log_path)
        return self.process

    def discard(self) -> None:
        if self.process.poll() is None:
            spawn.signal_group(self.process.pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("a discarded prewarmed replica (pid %d) did not exit", self.process.pid)


def _watch_orphan(child: ForkedProcess, pidfd: int) -> None:
    """Report the exit of a replica whose fork server died (its code is unknown: not our child)."""
    watched = WatchedProcess(child.pid, pidfd)
    child.exited(watched.wait())


def _kill(process: subprocess.Popen) -> None:
    """Kill the server (its reader, if any, sees EOF and closes stdout)."""
    if process.poll() is None:
        spawn.signal_group(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if process.stdin is not None:
        try:
            process.stdin.close()
        except OSError:
            pass
