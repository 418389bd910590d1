"""``service.lock`` as the loop needs it (global_scheduler/state_lock.py, issue 32): its version
counts the outermost releases (a read-only hold makes none), a coroutine awaits it without
blocking its loop, and ``threading.Condition`` still works over it as over an RLock."""

from __future__ import annotations

import asyncio
import threading
import time

from notebookos.global_scheduler.lock_holds import service_lock
from notebookos.global_scheduler.state_lock import LoopChanges, StateLock


def test_the_version_counts_outermost_releases_and_reads_make_none():
    lock = service_lock()
    assert isinstance(lock, StateLock)
    with lock:
        with lock:
            pass
        assert lock.version == 0  # an inner release lets nothing go
    assert lock.version == 1
    assert lock.acquire(blocking=False)
    lock.release_read()
    assert lock.version == 1


def test_a_coroutine_awaits_the_lock_while_the_loop_runs_on():
    lock = StateLock()
    held, go = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            go.wait(5)

    threading.Thread(target=holder, daemon=True).start()
    assert held.wait(5)

    async def main() -> tuple[int, float]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.get_running_loop().create_task(tick())
        asyncio.get_running_loop().call_later(0.3, go.set)
        started = time.monotonic()
        await lock.acquire_async()
        waited = time.monotonic() - started
        lock.release_read()
        ticker.cancel()
        return ticks, waited

    ticks, waited = asyncio.run(main())
    assert waited >= 0.25
    assert ticks >= 10  # the loop ran on while the coroutine waited


def test_a_condition_over_it_gives_the_whole_lock_up_while_waiting():
    lock = StateLock()
    cv = threading.Condition(lock)
    woken = threading.Event()

    def waiter() -> None:
        with lock, lock, cv:  # held three deep: a wait lets all of it go
            cv.wait(5)
            woken.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.1)
    before = lock.version
    with cv:  # taken while the waiter holds it three deep: only because the wait let go
        cv.notify_all()
    thread.join(5)
    assert woken.is_set()
    assert lock.version >= before + 1


def test_the_loops_blocking_takes_of_a_held_lock_are_timed_and_no_other():
    """``watch_loop``: a blocking take by the loop's thread while a pool thread holds the lock
    reports how long the loop stood still; a take of a free lock, a pool thread's own wait
    and a coroutine's ``acquire_async`` report nothing (the metric counts only the loop's
    stalls: what is left of the shared lock, issue 32)."""
    from notebookos.loop_thread import LoopThread

    loop = LoopThread("test-state-lock-loop")
    lock = StateLock()
    waited: list[float] = []
    lock.watch_loop(loop.thread, waited.append)
    try:
        def take_on_loop() -> None:
            with lock:
                pass

        loop.run(take_on_loop)  # free: nothing to report
        assert waited == []

        held, go = threading.Event(), threading.Event()

        def holder() -> None:
            with lock:
                held.set()
                go.wait(5)

        t = threading.Thread(target=holder, daemon=True)
        t.start()
        assert held.wait(5)
        threading.Timer(0.2, go.set).start()
        loop.run(take_on_loop)  # the loop stands still until the holder lets go
        t.join(5)
        assert len(waited) == 1 and 0.15 < waited[0] < 2.0

        # a pool thread waiting for the lock is not the loop standing still
        held.clear(), go.clear()
        t = threading.Thread(target=holder, daemon=True)
        t.start()
        assert held.wait(5)
        threading.Timer(0.1, go.set).start()
        with lock:
            pass
        t.join(5)

        # nor is a coroutine awaiting it
        held.clear(), go.clear()
        t = threading.Thread(target=holder, daemon=True)
        t.start()
        assert held.wait(5)
        threading.Timer(0.1, go.set).start()

        async def take_async() -> None:
            await lock.acquire_async()
            lock.release()

        loop.spawn(take_async()).result(5)
        t.join(5)
        assert len(waited) == 1
    finally:
        loop.close()


def test_loop_changes_wait_for_a_held_lock_without_blocking_and_keep_their_order(caplog):
    """``LoopChanges`` on the loop: with the lock free a change is made at once; held by a
    thread, changes queue (the loop runs on), and once it is let go they are made in the
    order asked, a change asked meanwhile with the lock free included (behind the queue, not
    before it); one that raises is logged and the rest are made. Off the loop: at once."""
    lock = StateLock()
    made: list[str] = []
    changes = LoopChanges(lock)
    held, go = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            go.wait(5)

    def fail() -> None:
        raise RuntimeError("a change that fails")

    async def main() -> tuple[list[str], int, float]:
        lock.watch_loop(threading.current_thread(), lambda s: None)
        changes.make(made.append, "free")
        assert made == ["free"]
        threading.Thread(target=holder, daemon=True).start()
        await asyncio.to_thread(held.wait, 5)
        started = time.monotonic()
        changes.make(made.append, "start")
        changes.make(fail)
        changes.make(made.append, "end")
        queued = changes.pending()
        blocked = time.monotonic() - started
        go.set()
        while changes.pending():
            await asyncio.sleep(0.01)
        changes.make(made.append, "after")
        return list(made), queued, blocked

    made_then, queued, blocked = asyncio.run(main())
    assert queued == 3 and blocked < 0.05
    assert made_then == ["free", "start", "end", "after"]
    assert "a change that fails" in caplog.text
    other = threading.Thread(target=changes.make, args=(made.append, "thread"))
    other.start()
    other.join(5)
    assert made[-1] == "thread"
