"""HostLink.close() against gRPC's thread: closing a channel waits for the callbacks gRPC's thread
is running, and a watch's callback takes the link's lock; close() must not hold it then (found on
a drained Swarm node: the Local Scheduler answered its held watch as it deregistered, and the
Global Scheduler froze with its registry lock held)."""

from __future__ import annotations

import threading

import grpc

from notebookos.global_scheduler.hosts import HostLink


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
