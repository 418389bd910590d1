"""A cell sent while the Global Scheduler dies is neither lost nor run twice.

`notebookos up` with a notebook over Jupyter Server's kernel websocket (JupyterLab's protocol).
First the request is lost for sure: the Global Scheduler is stopped (SIGSTOP) so the request sits
unread in its socket, then killed, which discards it. ZMQ has no acknowledgements and Jupyter no
retransmission, so before the fix the notebook waited for that cell forever (the fault
campaign's fault 92). Then the Global Scheduler is killed while a cell runs: Jupyter Server
resends that request too (it cannot know it was routed), and the replicas must answer the copy
with the reply they gave, without running the cell a second time.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from notebookos.testing.up_session import Notebook, UpCluster

CELL_S = 120.0


@pytest.mark.timeout(480)
def test_a_cell_sent_as_the_global_scheduler_dies_runs_once(tmp_path: Path) -> None:
    cluster = UpCluster(tmp_path, hosts=3)
    try:
        cluster.wait_up()
        asyncio.run(_scenario(cluster))
    except BaseException:
        print("notebookos up:\n" + "".join(cluster.lines[-80:]))
        raise
    finally:
        cluster.stop()


async def _scenario(cluster: UpCluster) -> None:
    notebook = Notebook(cluster.base, cluster.token)
    await notebook.open()
    try:
        first = await notebook.execute("n = 0\nprint('n', n)", timeout=CELL_S)
        assert (first.status, first.stdout) == ("ok", "n 0\n"), first

        # 1. The request dies unread with the Global Scheduler.
        gs = cluster.global_scheduler()
        gs.suspend()
        t0 = time.monotonic()
        lost = notebook.send_execute("n += 1\nprint('n', n)")
        await asyncio.sleep(0.5)  # delivered into the stopped process's socket
        gs.kill()
        result = await notebook.result(lost, t0, t0 + CELL_S)
        assert (result.status, result.stdout) == ("ok", "n 1\n"), result
        await _whole(cluster, notebook.kernel_id)

        # 2. The request was routed and runs when the Global Scheduler dies: resent, not rerun.
        t0 = time.monotonic()
        running = notebook.send_execute("import time\ntime.sleep(4)\nn += 1\nprint('n', n)")
        await asyncio.sleep(2.0)
        cluster.global_scheduler().kill()
        result = await notebook.result(running, t0, t0 + CELL_S)
        assert (result.status, result.stdout) == ("ok", "n 2\n"), result
        assert await notebook.replies_to(running, 3.0) == 0, "a second execute_reply came"

        after = await notebook.execute("print('n', n)", timeout=CELL_S)
        assert (after.status, after.stdout) == ("ok", "n 2\n"), after
        assert cluster.restarts() >= 2
    finally:
        await notebook.close()


async def _whole(cluster: UpCluster, kernel_id: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(cluster.whole, kernel_id):
        assert time.monotonic() < deadline, "the kernel did not get its three replicas back"
        await asyncio.sleep(0.5)
