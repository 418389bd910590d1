"""The provisioner as jupyter_client drives it, against a real cluster: shutdown and restart tear
down every replica, interrupts reach the running cell, and a new manager re-attaches to a running
kernel from the saved provisioner info (what a restarted Jupyter Server does)."""

from __future__ import annotations

import asyncio
import time

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import KernelProvisionerFactory
from nbos_cluster import Cluster, replica_pids, wait_gone


async def execute(km: AsyncKernelManager, code: str, timeout: float = 60) -> dict:
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(code, timeout=timeout,
                                                 output_hook=lambda msg: None)
        return reply["content"]
    finally:
        client.stop_channels()


async def user_expression(km: AsyncKernelManager, expr: str) -> str:
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive("", user_expressions={"v": expr}, timeout=60,
                                                 output_hook=lambda msg: None)
        value = reply["content"]["user_expressions"]["v"]
        return value["data"]["text/plain"] if value["status"] == "ok" else value["ename"]
    finally:
        client.stop_channels()


def test_shutdown_and_restart_tear_down_every_replica(nbos_cluster: Cluster) -> None:
    async def body() -> None:
        km = AsyncKernelManager(kernel_name="notebookos")
        await km.start_kernel()
        assert (await execute(km, "x = 5"))["status"] == "ok"
        first = replica_pids(nbos_cluster.address, km.kernel_id)
        assert first and len(first) == 3

        await km.restart_kernel(now=True)
        assert wait_gone(first) == [], "replicas of the restarted kernel survived"
        assert await user_expression(km, "x") == "NameError"  # a restart starts afresh
        second = replica_pids(nbos_cluster.address, km.kernel_id)
        assert second and len(second) == 3 and not set(second) & set(first)

        await km.shutdown_kernel(now=False)
        assert wait_gone(second) == [], "replicas survived shutdown"
        assert replica_pids(nbos_cluster.address, km.kernel_id) is None

    asyncio.run(body())


def test_a_restart_keeps_the_ports_so_a_client_connected_before_reaches_the_new_kernel(
        nbos_cluster: Cluster) -> None:
    """Jupyter Server's restart (``restart_kernel(now=False)``: a shutdown_request first) gives
    fresh replicas behind the same front: the ports stay, so the sockets a client opened before
    (Jupyter Server's open websocket keeps its streams) reach the new kernel. It used to stop
    the kernel and start a new front on new ports: every cell sent on the notebook's websocket
    after a restart went nowhere and the notebook waited for good."""
    async def body() -> None:
        km = AsyncKernelManager(kernel_name="notebookos")
        await km.start_kernel()
        client = km.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            reply = await client.execute_interactive("x = 5", timeout=60,
                                                     output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok"
            ports, first = list(km.ports), replica_pids(nbos_cluster.address, km.kernel_id)

            await km.restart_kernel(now=False)
            assert list(km.ports) == ports
            assert wait_gone(first) == [], "replicas of the restarted kernel survived"
            reply = await client.execute_interactive(
                "print('x' in dir())", timeout=60,
                output_hook=lambda msg: seen.append(msg["content"].get("text", "")))
            assert reply["content"]["status"] == "ok" and "False" in "".join(seen)
        finally:
            client.stop_channels()
            await km.shutdown_kernel(now=True)

    seen: list[str] = []
    asyncio.run(body())


def test_interrupt_stops_the_running_cell(nbos_cluster: Cluster) -> None:
    async def body() -> None:
        km = AsyncKernelManager(kernel_name="notebookos")
        await km.start_kernel()
        try:
            client = km.client()
            client.start_channels()
            await client.wait_for_ready(timeout=60)
            started = time.monotonic()
            msg_id = client.execute("import time\ntime.sleep(60)")
            while True:  # interrupt it once it runs (one still queued is aborted instead)
                msg = await client.get_iopub_msg(timeout=30)
                if msg["parent_header"].get("msg_id") == msg_id \
                        and msg["msg_type"] == "execute_input":
                    break
            await asyncio.sleep(0.5)
            await km.interrupt_kernel()
            reply = await client.get_shell_msg(timeout=30)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = await client.get_shell_msg(timeout=30)
            assert reply["content"]["status"] == "error"
            assert reply["content"]["ename"] == "KeyboardInterrupt"
            assert time.monotonic() - started < 30
            client.stop_channels()
            after = await execute(km, "after = 1")
            assert after["status"] == "ok", after
            assert await user_expression(km, "after") == "1"  # it ran (not a stale answer)
        finally:
            await km.shutdown_kernel(now=True)

    asyncio.run(body())


def test_every_client_of_one_manager_runs_its_cells(nbos_cluster: Cluster) -> None:
    """jupyter_client numbers each client's msg_ids from 0 (the clients share the manager's
    session id), so a second client sends the ids the first one sent. Each cell must still run
    once: before, the second client's cells were answered "ok" from the first one's elections
    and never ran."""
    async def body() -> None:
        km = AsyncKernelManager(kernel_name="notebookos")
        await km.start_kernel()
        try:
            for n in range(1, 4):  # a client each: ids <session>_<pid>_0, _1 every time
                reply = await execute(km, f"runs = globals().get('runs', 0) + 1\nruns_{n} = {n}")
                assert reply["status"] == "ok", reply
            assert await user_expression(km, "(runs, runs_1, runs_2, runs_3)") == "(3, 1, 2, 3)"
        finally:
            await km.shutdown_kernel(now=True)

    asyncio.run(body())


def test_a_new_manager_reattaches_from_provisioner_info(nbos_cluster: Cluster) -> None:
    async def body() -> None:
        first = AsyncKernelManager(kernel_name="notebookos")
        await first.start_kernel()
        assert (await execute(first, "kept = 'still here'"))["status"] == "ok"
        info = await first.provisioner.get_provisioner_info()
        connection = first.get_connection_info()
        # The first Jupyter Server goes away without shutting its kernel down.
        first.stop_restarter()

        second = AsyncKernelManager(kernel_name="notebookos")
        second.kernel_id = first.kernel_id
        second.provisioner = KernelProvisionerFactory.instance().create_provisioner_instance(
            first.kernel_id, second.kernel_spec, parent=second)
        await second.provisioner.load_provisioner_info(info)
        second.load_connection_info(connection)
        assert await second.is_alive()
        assert await user_expression(second, "kept") == "'still here'"
        await second.shutdown_kernel(now=True)
        assert replica_pids(nbos_cluster.address, first.kernel_id) is None

    asyncio.run(body())
