"""Work the Global Scheduler starts and does not wait for (a kernel's recovery, a wake, the last
steps of a start): a failure says so in the log instead of being dropped with its future (the
fault campaign, seed 14: a notebook stayed awake for two minutes with nothing in the log), and
a task on the loop is kept referenced until it ends (asyncio keeps only a weak reference)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent import futures
from typing import Any

log = logging.getLogger("notebookos.global_scheduler")


def log_failure(future: asyncio.Future | futures.Future) -> None:
    """A done-callback: the work's exception, if any, logged with its traceback."""
    if not future.cancelled() and future.exception() is not None:
        exc = future.exception()
        log.error("background work failed: %s", exc,
                  exc_info=(type(exc), exc, exc.__traceback__))


def spawn(work: Awaitable[Any], kept: set, logged: bool = True) -> asyncio.Future:
    """``work`` as a task on the running loop, in ``kept`` until it ends. ``logged``: its
    failure is logged; otherwise only taken (someone awaits it and has it; asyncio would log it
    as never retrieved when they went away)."""
    task = asyncio.ensure_future(work)
    kept.add(task)
    task.add_done_callback(kept.discard)
    task.add_done_callback(log_failure if logged else _take_exception)
    return task


def _take_exception(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
