"""A replica tells its host which installed packages its notebook uses (issue 34).

The host's fork server and prewarm pool learn from it what to import ahead
(``local_scheduler/preload_learning.py``): once a notebook on the host used torch, the replicas
started, replaced or woken afterwards are forked from an interpreter that holds torch already (a
wake's next cell then runs in about 1 s instead of importing torch first, 2.5-10 s).

The launcher names a report file (``NOTEBOOKOS_IMPORT_REPORT``; replicas of a host share it).
The replica's state sync already lists the library modules each cell imported (and a standby,
those its executor imported: it imports them too); ``ImportReport.add`` appends the new
top-level names among them, one a line, in one ``O_APPEND`` write. No thread and no timer: it
costs nothing while the notebook is idle. It sends candidates only (not the standard library's,
not private ones); the Local Scheduler decides what is an installed package worth importing and
bounds the set.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

ENV_IMPORT_REPORT = "NOTEBOOKOS_IMPORT_REPORT"
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


class ImportReport:
    """Appends the top-level names of newly imported library modules to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._said: set[str] = set()

    @classmethod
    def from_environment(cls) -> ImportReport | None:
        """The report the launcher asked for (None: none). Taken out of the environment, so
        that a process the notebook starts does not write to it."""
        path = os.environ.pop(ENV_IMPORT_REPORT, "")
        return cls(path) if path else None

    def add(self, module_names: Iterable[str]) -> list[str]:
        """Report the top-level packages of ``module_names`` not reported before; returns
        them. A report that cannot be written is given up (the host's folder is gone)."""
        names = sorted(candidates(module_names) - self._said)
        if not names:
            return []
        self._said.update(names)
        if not _append(self.path, names):
            self._said.update(STDLIB)  # harmless; keeps the cost of later calls to a set test
        return names


def candidates(module_names: Iterable[str]) -> set[str]:
    """Top-level names of ``module_names`` that may be packages worth preloading: not the
    standard library's, not private."""
    tops = {name.partition(".")[0] for name in module_names}
    return {name for name in tops if name and name not in STDLIB and not name.startswith("_")}


def _append(path: str, names: list[str]) -> bool:
    """Append ``names``, one a line, in one write; False when the file cannot be written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, "".join(f"{name}\n" for name in names).encode())
        finally:
            os.close(fd)
    except OSError:
        return False
    return True
