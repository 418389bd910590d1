"""A state file as a live ``notebookos up`` writes it (``notebookos.supervisor``), for the tests of
what ``notebookos status`` and the JupyterLab server extension make of it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from notebookos.supervisor import state_file


def write_state(state_dir: Path, address: str, retry_in_s: float = 8.0,
                pid: int | None = None) -> None:
    """A state file as a live `notebookos up` (this process) writes it while its Global
    Scheduler waits for restart attempt 4."""
    path = state_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "version": 1, "supervisor_pid": pid or os.getpid(), "stopping": False,
        "global_scheduler": address,
        "daemons": [
            {"name": "global-scheduler", "state": "restarting", "pid": 4242, "attempt": 4,
             "restarts": 3, "last_exit": "killed by SIGKILL after 3.1 s",
             "next_try_at": time.time() + retry_in_s},
            {"name": "local-scheduler-0", "state": "running", "pid": 4243, "attempt": 0,
             "restarts": 0, "last_exit": ""},
            {"name": "jupyterlab", "state": "running", "pid": 4244, "attempt": 0,
             "restarts": 0, "last_exit": ""},
        ]}))
