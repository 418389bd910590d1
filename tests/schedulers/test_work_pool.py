"""The Global Scheduler's background work says when a task fails (a bare executor's future
keeps the exception to itself: a hibernation check that raised would leave a notebook awake
with nothing in the log)."""

from __future__ import annotations

import logging

import pytest

from notebookos.global_scheduler.service import WorkPool


def test_a_task_that_raises_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture):
    def hibernation_due() -> None:
        raise KeyError("kernel gone")

    pool = WorkPool(max_workers=1)
    try:
        with caplog.at_level(logging.ERROR, logger="notebookos.global_scheduler.service"):
            future = pool.submit(hibernation_due)
            with pytest.raises(KeyError):
                future.result(timeout=5)
            pool.shutdown(wait=True)
    finally:
        pool.shutdown(wait=False)
    failures = [r for r in caplog.records if "background work failed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None and "hibernation_due" in caplog.text


def test_a_task_that_succeeds_logs_nothing(caplog: pytest.LogCaptureFixture):
    pool = WorkPool(max_workers=1)
    with caplog.at_level(logging.ERROR, logger="notebookos.global_scheduler.service"):
        assert pool.submit(lambda: 7).result(timeout=5) == 7
        pool.shutdown(wait=True)
    assert not caplog.records
