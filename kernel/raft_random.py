"""Raft's own random numbers, apart from the user's.

A replica's Raft (pysyncobj, and this package's election timing in raft_start.py and
raft_rest.py) draws election timeouts and jitter at random. Drawn from Python's global
``random`` generator, they consumed the user's numbers: ``random.seed(1)`` then
``random.random()`` gave plain IPython's third number, not its first, on a replica that had
just run an election (issue 31). The user's generators are part of the notebook's state
(kernel/rng_state.py); the kernel's timing uses its own generator, seeded from the OS.
"""

from __future__ import annotations

import random

import pysyncobj.dns_resolver
import pysyncobj.syncobj
import pysyncobj.transport

RAFT_RANDOM = random.Random()


def keep_raft_off_the_users_generator() -> None:
    """Point pysyncobj's module-level ``random`` at Raft's own generator: its election timeout
    and its transport call ``random.random()``, its resolver ``random.choice()`` once per peer
    address it resolves (a woken kernel's replicas drew two of the user's numbers that way
    before its first cell); a ``random.Random`` answers each the same way. Idempotent."""
    pysyncobj.syncobj.random = RAFT_RANDOM  # type: ignore[attr-defined]
    pysyncobj.transport.random = RAFT_RANDOM  # type: ignore[attr-defined]
    pysyncobj.dns_resolver.random = RAFT_RANDOM  # type: ignore[attr-defined]
