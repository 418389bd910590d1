"""The executor's library imports, replayed on the standbys before one of them has to take over.

A cell's own ``import torch`` reaches the standbys with its state, but much of what a notebook
imports is imported lazily by the libraries themselves at first use: the first ``opt.step()`` or
``loss.backward()`` of a torch program imports ``torch._dynamo`` and with it sympy and hundreds
of modules (seconds of CPU). The executor pays that in the first cell that needs it; a standby
never runs a cell, so before this module it paid it again in the first cell after a failover,
which is when the user waits for it (issue 36: the next cell after the executor's SIGKILL took
seconds with a torch model in the namespace, tenths of a second without).

``LibraryImports`` tells which library modules the process imported since it last asked (one
length check when nothing was imported: the trivial cell's path). ``ModuleWarmer`` imports names
received from the executor on one background worker, in the executor's order, ignoring any that
fail (the cell that needs one imports it again and reports its own error).

Only library modules travel: those whose file lies under the interpreter's standard library, its
site-packages or a folder that a site directory's ``.pth`` file adds (a venv layered on another
one's packages: before, torch found that way did not count, and the first cell after a failover
imported torch._dynamo while the user waited, 3 s of a 3.9 s failover). A module of the user's own (``import mytrain`` from the notebook's folder) may
do work at import and is imported by the standby only when a cell asks for it, as before.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

# the library folders are the core's (the Local Scheduler's preload learning checks the same)
from notebookos.library_paths import library_roots, pth_folders  # noqa: F401 - re-exported

log = logging.getLogger(__name__)


# computed once, at import (a forked replica inherits it from the fork server's preload)
LIBRARY_ROOTS = library_roots()


class LibraryImports:
    """The library modules imported since the last call of ``new()``."""

    def __init__(self, roots: tuple[str, ...] | None = None) -> None:
        self._roots = roots if roots is not None else LIBRARY_ROOTS
        self._seen: set[str] = set(sys.modules)
        self._count = len(sys.modules)
        self._realpaths: dict[str, str] = {}

    def known(self, names: Iterable[str]) -> None:
        """Names another replica reported: never reported again from here (a standby that takes
        over does not send back what it was sent, nor pays to classify it)."""
        self._seen.update(names)

    def new(self) -> list[str]:
        """Names of library modules imported since the previous call, in import order."""
        modules = sys.modules
        if len(modules) == self._count:
            return []  # nothing imported (a removal and an import in one cell are rare: next time)
        found: list[str] = []
        for name, module in list(modules.items()):
            if name in self._seen:
                continue
            self._seen.add(name)
            if self.is_library(module):
                found.append(name)
        self._count = len(modules)
        return found

    def is_library(self, module: object) -> bool:
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if not isinstance(origin, str) or not origin.startswith(os.sep):
            return False  # built-in, frozen, namespace package or a module made in memory
        folder = os.path.dirname(origin)
        real = self._realpaths.get(folder)
        if real is None:
            real = self._realpaths[folder] = os.path.realpath(folder) + os.sep
        return real.startswith(self._roots)


class ModuleWarmer:
    """Imports module names on one background worker, skipping those already imported.

    At normal priority, on purpose: a cell that needs a module this worker is importing waits
    for the module's import lock, so a worker at a lower priority (nice 10, tried) made such a
    cell wait longer on a loaded host (the fault campaign's kill-executor: 18 s p50)."""

    def __init__(self) -> None:
        self._worker: ThreadPoolExecutor | None = None
        self.imported = 0
        self.failed: dict[str, str] = {}

    def warm(self, names: Iterable[str]) -> None:
        wanted = [name for name in names if name not in sys.modules]
        if not wanted:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="nbos-warm-imports")
        self._worker.submit(self._import_all, wanted)

    def _import_all(self, names: list[str]) -> None:
        start = time.monotonic()
        count = 0
        for name in names:
            if name in sys.modules or name in self.failed:
                continue
            try:
                importlib.import_module(name)
                count += 1
            except BaseException as exc:  # noqa: BLE001 - the cell that needs it reports it
                self.failed[name] = f"{type(exc).__name__}: {exc}"
        self.imported += count
        if count:
            log.info("imported %d module(s) the executor had imported, in %.2f s",
                     count, time.monotonic() - start)

    def wait(self, timeout: float | None = None) -> None:
        """Block until what was queued so far is imported (for tests and benchmarks)."""
        if self._worker is not None:
            self._worker.submit(lambda: None).result(timeout)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
