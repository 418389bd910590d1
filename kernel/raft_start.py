"""A new group's first election without pysyncobj's waits (kernel start, issue 18).

Left alone, pysyncobj's founding replicas wait for their first election timeout (a random 0.25 to
0.6 s after the replica made its ``SyncObj``, and only once connected), and a replica that tried
to connect before its peer listened retries only after ``connectionRetryTime`` (0.2 s): on a
kernel's start both waits are on the path to the first cell's reply, after every replica is up.

``QuickStart`` shortens them for the founders of a new group only (never a ``--join`` replica,
which must hear the leader rather than disturb it: pysyncobj has no pre-vote) and only until the
group has its first leader: connections are retried every ``retry`` seconds, and once a founder
is connected to a majority of the members it campaigns after ``rank * step`` seconds (plus a
little jitter), ``rank`` being its place among the members' addresses, so that the first one
normally wins at once and the others do not split the vote. If it does not win, the normal
random timeouts take over, as before. Only timing changes: Raft's votes and terms are
pysyncobj's own, so safety does not depend on any of this.
"""

from __future__ import annotations

import logging
from typing import Any

from pysyncobj.monotonic import monotonic as raft_clock

from .raft_random import RAFT_RANDOM

log = logging.getLogger(__name__)


class QuickStart:
    """Runs on pysyncobj's tick thread (``addOnTickCallback``) until the first leader."""

    def __init__(self, sync: Any, self_address: str, members: list[str], retry: float = 0.05,
                 step: float = 0.15, jitter: float = 0.05) -> None:
        self._sync = sync
        addresses = sorted(set(members) | {self_address})
        self.rank = addresses.index(self_address)
        self.size = len(addresses)
        self._step = step
        self._jitter = jitter
        self.active = all(hasattr(sync, f"_SyncObj__{name}") for name in
                          ("conf", "raftLeader", "raftCurrentTerm", "connectedNodes",
                           "raftElectionDeadline"))
        self.campaign_at: float | None = None
        if not self.active:
            log.warning("this pysyncobj lacks the state QuickStart needs: normal first election")
            return
        conf = self._get("conf")
        self._normal_retry = conf.connectionRetryTime
        conf.connectionRetryTime = min(retry, conf.connectionRetryTime)
        sync.addOnTickCallback(self.on_tick)

    def _get(self, name: str) -> Any:
        return getattr(self._sync, f"_SyncObj__{name}")

    def on_tick(self) -> None:
        if not self.active:
            return
        if self._get("raftLeader") is not None or self._get("raftCurrentTerm") > 0:
            self.stop()  # a leader, or an election under way: pysyncobj's timings from now
            return
        if self.campaign_at is not None:
            return
        if len(self._get("connectedNodes")) + 1 <= self.size / 2:
            return  # a vote now could not win: wait for a majority of the members
        now = raft_clock()  # pysyncobj's clock (raft_rest.py)
        self.campaign_at = now + self.rank * self._step + RAFT_RANDOM.uniform(0.0, self._jitter)
        if self.campaign_at < self._get("raftElectionDeadline"):
            self._sync._SyncObj__raftElectionDeadline = self.campaign_at

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False  # the callback stays (removing it from a tick would deadlock)
        self._get("conf").connectionRetryTime = self._normal_retry
