"""A replica makes its store's client ahead of the first tensor once torch is loaded, and never
before: the client (boto3) costs tens of MB that a kernel without torch should not hold."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from notebookos.testing.optional import require_torch

require_torch()

pytestmark = pytest.mark.services

SCRIPT = textwrap.dedent("""
    import logging, sys, time
    from notebookos.kernel.state_sync import StateSync

    sync = StateSync(sys.argv[1], b"k" * 32, "k-warm", 1 << 20, logging.getLogger("warm"))
    ns = {}
    assert sync.apply_checked(ns, b"not an update")  # refused, and no torch: nothing warms
    sync.warm_store_once_torch_is_loaded()
    time.sleep(0.5)
    print("before torch:", sync.store.opened, "boto3" in sys.modules, flush=True)
    import torch  # noqa: F401 - what a notebook's first cell does
    sync.warm_store_once_torch_is_loaded()
    deadline = time.monotonic() + 60
    while not sync.store.opened and time.monotonic() < deadline:
        time.sleep(0.05)
    print("after torch:", sync.store.opened, "boto3" in sys.modules, flush=True)
""")


def test_the_store_client_is_made_once_torch_is_loaded_and_not_before(s3_store_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, s3_store_url], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["before torch: False False", "after torch: True True"], (
        done.stdout, done.stderr[-3000:])
