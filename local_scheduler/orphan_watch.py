"""In a replica: outlive the Local Scheduler that started it, and end when no successor takes it back.

A replica used to die with its Local Scheduler (``PR_SET_PDEATHSIG``), so a Local Scheduler's
restart cost every replica on the host, and their kernels ran on fewer replicas than their status
said until the restarted daemon registered (issue 33). Now a replica lives on; a thread blocks on
a pidfd of its Local Scheduler (no polling) and, when that one exits, waits ``grace_s`` for a
successor: a restarted Local Scheduler that took it back writes its own pid into the records that
list this replica (``replica_records.py``). If one did, the replica watches that one instead; if
none did (the host's daemon is gone for good, or the cluster was stopped without stopping its
replicas), the replica ends its process group rather than live on unwatched, voting in a Raft
group whose scheduler has replaced it.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time

from notebookos.local_scheduler import replica_records
from notebookos.local_scheduler.pid_watch import open_pidfd

log = logging.getLogger(__name__)
DEFAULT_GRACE_S = 60.0


def start_from_environment() -> None:
    """Start the watch when the launcher named its Local Scheduler and records (else nothing)."""
    ls_pid = os.environ.pop(replica_records.ENV_LS_PID, "")
    state_file = os.environ.pop(replica_records.ENV_STATE_FILE, "")
    grace = os.environ.pop(replica_records.ENV_ORPHAN_GRACE_S, "")
    if not ls_pid.isdigit() or not state_file or not sys.platform.startswith("linux"):
        return
    try:
        grace_s = float(grace) if grace else DEFAULT_GRACE_S
    except ValueError:
        grace_s = DEFAULT_GRACE_S
    threading.Thread(target=watch, args=(int(ls_pid), state_file, grace_s), daemon=True,
                     name="nbos-orphan-watch").start()


def watch(ls_pid: int, state_file: str, grace_s: float) -> None:
    me = os.getpid()
    while True:
        fd = open_pidfd(ls_pid)
        if fd is not None:
            select.select([fd], [], [])  # until the Local Scheduler exits
            os.close(fd)
        time.sleep(grace_s)
        successor = replica_records.holder_of(state_file, me)
        if successor is None or successor == ls_pid or open_pidfd(successor) is None:
            _end(ls_pid, grace_s)
            return
        print(f"notebookos: Local Scheduler {ls_pid} exited; Local Scheduler {successor} took "
              "this replica back", file=sys.__stderr__, flush=True)
        ls_pid = successor


def _end(ls_pid: int, grace_s: float) -> None:
    print(f"notebookos: Local Scheduler {ls_pid} exited and none took this replica back within "
          f"{grace_s:g} s: ending it", file=sys.__stderr__, flush=True)
    try:
        os.killpg(os.getpgid(0), signal.SIGTERM)
    except OSError:
        pass
    time.sleep(5)
    os._exit(1)
