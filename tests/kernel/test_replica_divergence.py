"""A replica executes a cell only once its namespace is the committed state (issues 11 and 19).

Real replica processes and real Raft: a replica that could not load part of the state (here its
store lacks the objects: a real fault, a store it cannot read) never runs a cell, re-syncs once it
can, and exits to be replaced when it cannot; an elected executor that has not applied the
previous cell's update yet waits for it instead of running the cell without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from harness import ReplicaGroup

from notebookos.kernel.replica import DIVERGED_EXIT_CODE
from notebookos.kernel.replies import ALL_YIELDED


def _group(tmp_path: Path, own_store: dict[int, str] | None = None, *args: str) -> ReplicaGroup:
    return ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store", store_urls=own_store,
                        extra_args=list(args))


def test_a_replica_lacking_a_large_object_never_runs_a_cell_until_it_has_resynced(
    tmp_path: Path,
):
    """Issue 11.2: a standby that could not fetch `big` once carried on and, elected, ran the
    next cell without it (NameError). Now it yields, re-syncs when the object is reachable,
    and then runs cells with the whole state."""
    group = _group(tmp_path, {3: f"file://{tmp_path}/store3"},
                   "--ReplicaKernel.diverged_exit_after=300")
    try:
        group.start()
        group.execute("import numpy as np\nbig = np.arange(300_000.0)\nv = 1", target=1)
        group.wait_status(lambda s: s[3]["checkpoint_count"] == 1)
        time.sleep(0.5)  # replica 3 has tried (and failed) to fetch `big` by now
        result = group.execute("print(v, float(big.sum()))", target=3)
        for rid, reply in result.replies.items():  # nothing ran: no NameError anywhere
            assert reply["content"].get("ename") == ALL_YIELDED, (rid, result.summary())
        status = group.status()
        assert "big" in status[3]["diverged"] and not status[3]["caught_up"], status
        assert not status[1]["diverged"] and status[1]["caught_up"], status
        shutil.copytree(tmp_path / "store", tmp_path / "store3", dirs_exist_ok=True)
        group.wait_status(lambda s: s[3]["caught_up"], timeout=30)
        result = group.execute("print(v, float(big.sum()))", target=3)
        assert result.executor() == 3, result.summary()
        assert result.stdout() == f"1 {float(sum(range(300_000)))}\n", result.summary()
    finally:
        group.stop()


def test_a_replica_that_cannot_resync_exits_to_be_replaced(tmp_path: Path):
    group = _group(tmp_path, {3: f"file://{tmp_path}/store3"},
                   "--ReplicaKernel.diverged_exit_after=1")
    try:
        group.start()
        group.execute("import numpy as np\nbig = np.ones(300_000)", target=1)
        proc = group.replicas[3].proc
        assert proc is not None
        assert proc.wait(timeout=20) == DIVERGED_EXIT_CODE
        assert "exiting so that the scheduler replaces it" in group.replicas[3].log_tail(20_000)
        group.replicas[3].client.stop_channels()
        group.replicas[3].client = None
        result = group.execute("print(int(big.sum()))", target=2)
        assert result.stdout() == "300000\n", result.summary()
    finally:
        group.stop()


@pytest.mark.parametrize("attempt", range(3))
def test_an_executor_elected_before_applying_the_previous_update_waits_for_it(
    tmp_path: Path, attempt: int,
):
    """Issue 19.4: replica 2 misses cell 1 (stopped), then is asked to run cell 2 the moment it
    resumes: its LEAD can be decided while cell 1's update is still being applied there."""
    group = _group(tmp_path)
    try:
        group.start()
        group.execute("import numpy as np", target=1)
        pid = group.replicas[2].proc.pid
        os.killpg(pid, signal.SIGSTOP)
        try:
            group.execute("v = 1\nbig = np.full(4_000_000, 3.0)", target=1, to=[1, 3])
            msg_id = group.send_execute("print(v, float(big.sum()))", target=2)
            time.sleep(0.1)
        finally:
            os.killpg(pid, signal.SIGCONT)
        result = group.collect(msg_id, [1, 2, 3], target=2, timeout=60)
        assert result.executor() == 2, result.summary()
        assert result.stdout() == "1 12000000.0\n", (result.summary(), result.stderr())
    finally:
        group.stop()
