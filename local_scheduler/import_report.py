"""In a replica: tell the Local Scheduler which installed packages its cells imported.

The host's fork server and prewarm pool learn from it what to import ahead (``preload_learning``):
once a notebook on the host used torch, the replicas started, replaced or woken afterwards are
forked from an interpreter that holds torch already (issue 34: a wake's next cell then runs in
about 1 s instead of importing torch first, 2.5-10 s).

Started by ``spawn.become_replica`` when the launcher named a report file
(``NOTEBOOKOS_IMPORT_REPORT``): one thread checks ``sys.modules`` every ``POLL_S`` (a length
compare when nothing was imported) and appends the new top-level names, one a line, in one
``O_APPEND`` write (replicas of a host share the file). It sends candidates only: what was
loaded when the replica started is left out, and the standard library (cheap to import); the
Local Scheduler decides what is an installed package worth importing and bounds the set.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

ENV_IMPORT_REPORT = "NOTEBOOKOS_IMPORT_REPORT"
POLL_S = 0.5
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def start_from_environment() -> None:
    """Start the reporter when the launcher named a report file (else nothing)."""
    path = os.environ.pop(ENV_IMPORT_REPORT, "")
    if path:
        known = top_level_names()
        threading.Thread(target=report, args=(path, known), daemon=True,
                         name="nbos-import-report").start()
        # a replica stopped (hibernation) while it imports torch still tells
        atexit.register(_last_report, path, known)


def top_level_names() -> set[str]:
    return {name.partition(".")[0] for name in list(sys.modules)}


def candidates(known: set[str]) -> list[str]:
    """Top-level modules loaded now and not in ``known`` (added to it): not the standard
    library's, not private, not made in memory (a file behind them)."""
    found = []
    for name in top_level_names() - known:
        known.add(name)
        module = sys.modules.get(name)
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if (name in STDLIB or name.startswith("_") or not isinstance(origin, str)
                or not origin.startswith(os.sep)):
            continue
        found.append(name)
    return sorted(found)


def report(path: str, known: set[str], poll_s: float = POLL_S) -> None:
    count = len(sys.modules)
    while True:
        time.sleep(poll_s)
        if len(sys.modules) == count:
            continue
        count = len(sys.modules)
        try:
            names = candidates(known)
        except RuntimeError:  # sys.modules changed while read: next time
            continue
        if names and not _write(path, names):
            return  # the Local Scheduler's folder is gone: nothing to tell


def _last_report(path: str, known: set[str]) -> None:
    try:
        _write(path, candidates(known))
    except RuntimeError:  # the reporter thread was at it: it wrote what it found
        pass


def _write(path: str, names: list[str]) -> bool:
    """Append ``names``, one a line, in one write; False when the file cannot be written."""
    if not names:
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, "".join(f"{name}\n" for name in names).encode())
        finally:
            os.close(fd)
    except OSError:
        return False
    return True
