"""HostLink.close() against gRPC's thread: closing a channel waits for the callbacks gRPC's thread
is running, and a watch's callback takes the link's lock; close() must not hold it then (found on
a drained Swarm node: the Local Scheduler answered its held watch as it deregistered, and the
Global Scheduler froze with its registry lock held)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc

from notebookos.global_scheduler.hosts import HostLink
from notebookos.proto import local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc


def test_close_does_not_hold_the_links_lock_while_its_channel_closes() -> None:
    callback_ran = threading.Event()
    link: HostLink | None = None

    def connect(address: str) -> grpc.Channel:
        channel = grpc.insecure_channel(address)
        close = channel.close

        def close_waiting_for_a_watch_callback() -> None:
            # what gRPC's thread does while the channel closes: a watch's done callback
            assert link is not None
            callback = threading.Thread(target=link._watch_call_start, kwargs={"held": False},
                                        daemon=True)
            callback.start()
            callback.join(5)
            if not callback.is_alive():
                callback_ran.set()
            close()

        channel.close = close_waiting_for_a_watch_callback  # type: ignore[method-assign]
        return channel

    link = HostLink("h1", "127.0.0.1:9", "instance", [], True, connect=connect)
    assert link.stub is not None  # the channel is open
    closer = threading.Thread(target=link.close, daemon=True)
    closer.start()
    closer.join(15)
    assert not closer.is_alive()
    assert callback_ran.is_set(), "the watch callback waited for the lock close() held"


class _WatchOnly(ls_grpc.LocalSchedulerServicer):
    """A Local Scheduler's ``WatchHost`` as the daemon answers it (local_scheduler/service.py):
    a probe (``answer_now``) at once, a held watch when the server stops."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def WatchHost(self, request, context):  # noqa: N802, ANN001, ANN201
        if not request.answer_now:
            self.stopped.wait()
        return local_scheduler_pb2.WatchHostResponse(instance_id="instance")


def test_a_local_scheduler_that_answers_again_counts_as_a_heartbeat() -> None:
    """Found by the fault campaign (seed 16): a host hung about 10 s answered the scheduler's
    probe again, its Local Scheduler was killed 0.3 s later, before its first heartbeat, and the
    host was declared lost for missed heartbeats 0.75 s after it had answered: the replica
    running the woken cell was dropped with it. An answer is as good as a heartbeat."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    link = HostLink("h1", address, "instance", [], True, connect=grpc.insecure_channel)
    servicer = _WatchOnly()
    server = None
    try:
        link.watch()  # nothing listens: the held watch fails, the link waits for an answer
        deadline = time.time() + 10
        while not link.unreachable_since and time.time() < deadline:
            time.sleep(0.02)
        assert link.unreachable_since, "the refused watch was not noticed"
        hung_since = time.time() - 9.5  # as if its heartbeats stopped 9.5 s ago
        link.last_heartbeat = hung_since
        server = grpc.server(futures.ThreadPoolExecutor(4))
        ls_grpc.add_LocalSchedulerServicer_to_server(servicer, server)
        server.add_insecure_port(address)
        server.start()
        deadline = time.time() + 15
        while link.unreachable_since and time.time() < deadline:
            time.sleep(0.02)
        assert not link.unreachable_since, "the probe was not answered"
        assert link.last_heartbeat > hung_since + 9, (
            "a host that answers again keeps its stale heartbeat time and is declared lost "
            "before its next heartbeat")
    finally:
        servicer.stopped.set()
        link.close()
        if server is not None:
            server.stop(0)
