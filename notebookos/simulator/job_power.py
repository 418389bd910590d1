"""Sleeping and waking hosts in the job engine, for a policy that ``sleeps_hosts`` (``ces``).

A sleeping host leaves the cluster (placement cannot see it, its GPUs are not provisioned) and
comes back ``wake_s`` after the policy asks for it. Every ``check_interval_s`` the engine samples
the running hosts (at least one GPU bound) and asks the policy how many empty hosts to put to
sleep. Figures (summary.json): ``node_hours_asleep``, ``node_hours_awake``, ``wakeups``,
``wakeups_per_day``, ``nodes_woken_per_wakeup``, ``node_utilisation`` (running / awake host-hours,
from the samples) and ``node_utilisation_all_awake`` (running / all host-hours).
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from notebookos.cluster import Host

if TYPE_CHECKING:
    from notebookos.simulator.jobsim import JobSimulator

CHECK, WAKE = 1, 2


class HostPower:
    def __init__(self, sim: JobSimulator) -> None:
        from notebookos.simulator.jobsim import TICK

        self.sim = sim
        self.policy = sim.policy
        self.tick_kind = TICK
        self.asleep: list[Host] = []
        self.waking = 0
        self.history: list[float] = []
        self.awake_samples: list[int] = []
        self.asleep_s = 0.0
        self.last = 0.0
        self.wakeups = 0
        self.woken = 0
        self.sleeps = 0

    def _push(self, when: float, code: int) -> None:
        heapq.heappush(self.sim.events, (when, self.tick_kind, -1, code))

    def _advance(self, now: float) -> None:
        if now > self.last:
            self.asleep_s += len(self.asleep) * (now - self.last)
            self.last = now

    def asleep_gpus(self) -> int:
        return sum(h.capacity.gpus for h in self.asleep)

    def start(self) -> None:
        self._push(self.policy.check_interval_s, CHECK)

    def on_tick(self, code: int, now: float) -> None:
        if code == CHECK:
            self._check(now)
            self._push(now + self.policy.check_interval_s, CHECK)
        elif code == WAKE:
            self._wake_one(now)

    def _check(self, now: float) -> None:
        cluster = self.sim.cluster
        gph = self.sim.gpus_per_host
        empty = sum(1 for _ in cluster.hosts_by_idle_gpus(gph))
        running = len(cluster.hosts) - empty
        self.history.append(float(running))
        self.awake_samples.append(len(cluster.hosts))
        count = self.policy.hosts_to_sleep(now, self.history, len(cluster.hosts) + self.waking)
        if count <= 0:
            return
        victims = [h for h in cluster.hosts_by_idle_gpus(gph) if h.is_empty][:count]
        if not victims:
            return
        self.sim._commit_change(now)
        self._advance(now)
        for host in victims:
            cluster.remove_host(host.host_id)
            self.asleep.append(host)
        self.sleeps += len(victims)
        self.sim.record.integrals.hosts = self.sim.host_count()

    def after_schedule(self, now: float) -> None:
        """JobArrivalCheck, after every scheduling pass: jobs still wait while hosts sleep, so
        wake what they lack (in whole hosts: free GPUs on busy hosts may not fit a job) plus the
        buffer, unless enough hosts are already waking."""
        sim = self.sim
        if not sim.waiting or len(self.asleep) <= self.waking:
            return
        free = sim.cluster.total_gpus - sim.cluster.committed_gpus
        demand = sum(sim.jobs[seq].q.num_gpus for _, seq in sim.waiting)
        gph = sim.gpus_per_host
        short_hosts = max(1, math.ceil((demand - free) / gph)) - self.waking
        if short_hosts <= 0:
            return
        count = self.policy.hosts_to_wake(now, short_hosts, len(self.asleep) - self.waking)
        if count <= 0:
            return
        self.wakeups += 1
        self.woken += count
        self.waking += count
        for _ in range(count):
            self._push(now + self.policy.wake_s, WAKE)

    def _wake_one(self, now: float) -> None:
        if not self.asleep:
            return
        self.sim._commit_change(now)
        self._advance(now)
        host = self.asleep.pop()
        self.waking -= 1
        self.sim.cluster.add_host(host)
        self.sim.record.integrals.hosts = self.sim.host_count()

    def finish(self, end: float) -> None:
        self._advance(end)
        days = max(end, 1.0) / 86400.0
        total_hosts = len(self.sim.cluster.hosts) + len(self.asleep)
        busy = sum(self.history)
        awake = sum(self.awake_samples)
        self.sim.record.extra.update({
            "node_hours_asleep": round(self.asleep_s / 3600.0, 3),
            "node_hours_awake": round(self.sim.record.integrals.host_s / 3600.0, 3),
            "wakeups": self.wakeups,
            "wakeups_per_day": round(self.wakeups / days, 3),
            "nodes_woken_per_wakeup": round(self.woken / self.wakeups, 3) if self.wakeups else 0.0,
            "nodes_put_to_sleep": self.sleeps,
            "node_utilisation": round(busy / awake, 4) if awake else None,
            "node_utilisation_all_awake": (round(busy / (total_hosts * len(self.history)), 4)
                                           if self.history else None),
            "forecast_fits": self.policy.forecast.fits,
        })
