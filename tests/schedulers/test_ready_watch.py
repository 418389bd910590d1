"""Every replica start is watched on one loop (local_scheduler/ready_watch.py, issue 32): real
listening sockets coming up late, a process gone, a deadline; one thread whatever the number."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from notebookos.local_scheduler.ready_watch import ReadyWatcher

pytestmark = pytest.mark.timeout(60)


def _unused_port() -> tuple[socket.socket, int]:
    """A bound, not yet listening socket: its port refuses connections until ``listen``."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def test_one_thread_learns_of_each_start_as_its_socket_listens() -> None:
    watcher = ReadyWatcher()
    count = 30
    results: dict[int, bool] = {}
    at: dict[int, float] = {}
    done = threading.Event()
    sockets = [_unused_port() for _ in range(count)]
    try:
        threads_before = threading.active_count()
        t0 = time.monotonic()

        def report(index: int):  # noqa: ANN202
            def on_done(ready: bool) -> None:
                results[index] = ready
                at[index] = time.monotonic() - t0
                if len(results) == count:
                    done.set()
            return on_done

        for i, (_, port) in enumerate(sockets):
            watcher.watch("127.0.0.1", port, lambda: False, 20.0, report(i))
        assert threading.active_count() <= threads_before + 1, "a thread per start"
        assert watcher.watching == count
        listened: dict[int, float] = {}
        for i, (s, _) in enumerate(sockets):  # they come up one by one, as replicas do
            time.sleep(0.01)
            listened[i] = time.monotonic() - t0
            s.listen()
        assert done.wait(20), f"only {len(results)} of {count} reported"
        assert all(results.values())
        # each one soon after it listened (the watch backs off to 100 ms at most)
        late = {i: round(at[i] - listened[i], 3) for i in range(count)
                if at[i] - listened[i] > 0.6}
        assert not late, f"reported late: {late}"
        assert all(at[i] >= listened[i] for i in range(count))
        assert watcher.watching == 0
    finally:
        watcher.close()
        for s, _ in sockets:
            s.close()


def test_an_exited_process_or_the_deadline_ends_a_watch_unready() -> None:
    watcher = ReadyWatcher()
    never, port = _unused_port()
    got: dict[str, tuple[bool, float]] = {}
    done = threading.Event()
    exited = threading.Event()
    try:
        t0 = time.monotonic()

        def record(name: str):  # noqa: ANN202
            def on_done(ready: bool) -> None:
                got[name] = (ready, time.monotonic() - t0)
                if len(got) == 2:
                    done.set()
            return on_done

        watcher.watch("127.0.0.1", port, exited.is_set, 30.0, record("exited"))
        watcher.watch("127.0.0.1", port, lambda: False, 0.5, record("deadline"))
        time.sleep(0.2)
        exited.set()
        assert done.wait(10), got
        assert got["exited"][0] is False and got["exited"][1] < 1.0
        assert got["deadline"][0] is False and 0.45 < got["deadline"][1] < 1.5
    finally:
        watcher.close()
        never.close()


def test_a_closed_watcher_reports_nothing_more_and_its_thread_ends() -> None:
    watcher = ReadyWatcher("ready-closing")
    never, port = _unused_port()
    got: list[bool] = []
    try:
        watcher.watch("127.0.0.1", port, lambda: False, 30.0, got.append)
        assert any(t.name == "ready-closing" for t in threading.enumerate())
        watcher.close()
        deadline = time.monotonic() + 5
        while any(t.name == "ready-closing" for t in threading.enumerate()):
            assert time.monotonic() < deadline, "the watch loop's thread outlived close()"
            time.sleep(0.05)
        watcher.watch("127.0.0.1", port, lambda: False, 30.0, got.append)  # ignored
        never.listen()
        time.sleep(0.3)
        assert got == []
    finally:
        never.close()
