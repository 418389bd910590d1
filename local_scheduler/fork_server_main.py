"""The fork server: one preloaded interpreter per Local Scheduler that forks replicas.

Started by the process launcher as ``python -m notebookos.local_scheduler.fork_server_main
MODULE``. It imports what a replica needs (as a prewarmed replica does), prints ``ready`` and
then reads orders, one JSON line each on stdin: ``{"tag": T, "argv": [...], "env": {...},
"log": PATH}``. For each it forks a child that becomes the replica exactly as a promoted
prewarmed one does (``prewarm_main.run_order``), so a replica started when the prewarm pool is
empty skips the interpreter's start and the imports (~0.3-0.5 s of CPU each, three at once on
a kernel start). It answers on stdout, one JSON line each:

- ``{"tag": T, "pid": P}`` once the child is forked (``{"tag": T, "error": ...}`` if not);
- ``{"exited": P, "code": C}`` when a child exits (C as ``Popen.returncode``: -N for signal N).

``{"tag": T, "import": [NAMES]}`` imports installed top-level packages the host learned its
replicas use (``preload_learning``), so later children are forked with them: answered ``{"tag":
T, "imported": {NAME: seconds}, "failed": {NAME: reason}, "rss_before_kb": B, "rss_kb": K,
"modules": [...]}`` (the server's resident memory before and after, the top-level modules it
holds then). While it imports (seconds: torch) one thread reaps and reports the children that
exit meanwhile (a stopped replica is not left a zombie whose stop waits for the import); it is
joined before the next fork. A name that is not an installed library
module is refused, not imported; an import that leaves a thread running is reported as failed
with ``"unsafe": true``: forking a threaded interpreter copies its locks but not its threads,
and the Local Scheduler then restarts the server without that module. ``{"tag": T, "modules":
true}`` is answered ``{"tag": T, "modules": [top-level names loaded]}``. The ``ready`` line
carries the same list.

An order ``{"tag": T, "wait": true}`` forks a child that waits for its order instead: a
prewarmed replica for the pool that costs a fork, not an interpreter's start. ``{"tag": T,
"promote": P, "argv": ..., "env": ..., "log": ...}`` hands child P its order (over a pipe only
the server holds) and is answered ``{"tag": T, "pid": P}``; the Local Scheduler discards a
waiting child by killing it.

The server is the children's parent and reaps them. Each child runs in a session of its own (a
stop signals its process group), dies with the server (``PR_SET_PDEATHSIG``), and the server dies
with the Local Scheduler (``spawn.die_with_parent``), so a replica never outlives it, as a cold
one never does. EOF on stdin (the Local Scheduler closed it) ends the server.

The server is one thread: nothing runs between its reads but a fork, so the fork copies a
quiet interpreter. What a fork shares that separate interpreters would not is made fresh in the
child: NumPy's global random state (Python's ``random`` is reseeded by CPython itself).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import selectors
import signal
import sys
import threading
import time

from notebookos.library_paths import TOP_LEVEL_NAME, refusal
from notebookos.local_scheduler.prewarm_main import preload, run_order
from notebookos.local_scheduler.spawn import PR_SET_PDEATHSIG, die_with_parent

USAGE = "usage: python -m notebookos.local_scheduler.fork_server_main MODULE"


def _answer(doc: dict) -> None:
    line = (json.dumps(doc) + "\n").encode()
    view = memoryview(line)
    while view:
        view = view[os.write(1, view):]


def _reap() -> list[int]:
    """Reap the children that exited, report each; their pids."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)
        _answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def loaded_modules() -> list[str]:
    """The top-level modules this interpreter holds."""
    return sorted({name.partition(".")[0] for name in list(sys.modules)})


def _status_value(key: str) -> int:
    """A number of /proc/self/status (``VmRSS`` in kB, ``Threads``); 0 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def import_learned(names: list) -> dict:
    """Import ``names`` (installed top-level packages only), one at a time, in this thread:
    the answer to an ``import`` order."""
    imported: dict[str, float] = {}
    failed: dict[str, str] = {}
    unsafe = False
    rss_before = _status_value("VmRSS")
    for name in names:
        if isinstance(name, str) and TOP_LEVEL_NAME.match(name) and name in sys.modules:
            imported[name] = 0.0
            continue
        why = refusal(name)
        if why is not None:
            failed[str(name)] = f"refused: {why}"
            continue
        threads = _status_value("Threads")
        started = time.monotonic()
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - reported; the server goes on
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        imported[name] = round(time.monotonic() - started, 3)
        if _status_value("Threads") > threads:
            failed[name] = "its import started a thread: forking this interpreter is unsafe now"
            unsafe = True
            break
    return {"imported": imported, "failed": failed, "unsafe": unsafe,
            "rss_before_kb": rss_before, "rss_kb": _status_value("VmRSS"),
            "modules": loaded_modules()}


def _import_reaping(names: list) -> tuple[dict, list[int]]:
    """``import_learned`` while a thread reaps the children that exit meanwhile (their exit
    notices go out at once); that thread has ended when this returns: the next fork copies a
    one-thread interpreter. Also the pids reaped."""
    stop = threading.Event()
    reaped: list[int] = []

    def reap() -> None:
        while not stop.wait(0.05):
            reaped.extend(_reap())

    reaper = threading.Thread(target=reap, name="reap-while-importing", daemon=True)
    reaper.start()
    try:
        return import_learned(names), reaped
    finally:
        stop.set()
        reaper.join()


def _become_child(server_pid: int, server_fds: tuple[int, ...]) -> None:
    """In the forked child: a session of its own, death with the server, nothing of its loop
    (``server_fds``: the server's own descriptors, closed)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in server_fds:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # not the Local Scheduler's pipes (run_order sets them for the replica)
    os.dup2(devnull, 1)
    os.close(devnull)
    os.setsid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:  # the server died between the fork and the prctl
            os._exit(0)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # else every kernel forked here draws the same numbers
        numpy_random.seed()


def _read_order(fd: int) -> dict | None:
    """In a waiting child: its order, or None when the server closed the pipe first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        data += chunk
    os.close(fd)
    return json.loads(data)


def serve(module: str) -> int:
    """The server's loop; returns in a forked child with that child's exit code."""
    server_pid = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    _answer({"ready": True, "modules": loaded_modules()})
    pending = b""
    waiting: dict[int, int] = {}  # a waiting child's pid -> the pipe its order goes down
    while True:
        for key, _events in selector.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                for pid in _reap():  # a waiting child that died: its order pipe goes too
                    fd = waiting.pop(pid, None)
                    if fd is not None:
                        os.close(fd)
                continue
            data = os.read(0, 1 << 16)
            if not data:
                return 0  # the Local Scheduler closed the pipe: the children die with this
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    order = json.loads(line)
                    tag = order["tag"]
                    if "import" in order:
                        result, reaped = _import_reaping(list(order["import"]))
                        for pid in reaped:  # a waiting child that died: its pipe goes too
                            fd = waiting.pop(pid, None)
                            if fd is not None:
                                os.close(fd)
                        _answer({"tag": tag, **result})
                        continue
                    if "modules" in order:
                        _answer({"tag": tag, "modules": loaded_modules()})
                        continue
                    wait = order.get("wait") is True
                    if not wait:
                        order["argv"]  # noqa: B018 - checked before forking
                except (ValueError, KeyError, TypeError) as exc:
                    _answer({"tag": None, "error": f"a malformed order: {exc!r}"})
                    continue
                if "promote" in order:
                    fd = waiting.pop(order["promote"], None)
                    if fd is None:
                        _answer({"tag": tag, "error": f"no waiting child {order['promote']}"})
                        continue
                    try:
                        os.write(fd, (json.dumps(order) + "\n").encode())  # < a pipe's buffer
                        _answer({"tag": tag, "pid": order["promote"]})
                    except OSError as exc:  # it died meanwhile
                        _answer({"tag": tag, "error": f"the waiting child is gone: {exc}"})
                    finally:
                        os.close(fd)
                    continue
                order_r, order_w = os.pipe() if wait else (-1, -1)
                try:
                    pid = os.fork()
                except OSError as exc:
                    for fd in (order_r, order_w):
                        if fd >= 0:
                            os.close(fd)
                    _answer({"tag": tag, "error": f"fork failed: {exc}"})
                    continue
                if pid == 0:
                    selector.close()
                    _become_child(server_pid, (wake_r, wake_w, *waiting.values()))
                    if wait:
                        os.close(order_w)
                        received = _read_order(order_r)
                        if received is None:
                            return 0  # discarded
                        order = received
                    return run_order(order, module)
                if wait:
                    os.close(order_r)
                    waiting[pid] = order_w
                _answer({"tag": tag, "pid": pid})


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    die_with_parent()
    preload(argv[0])
    return serve(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
