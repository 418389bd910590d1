"""Hibernation in the session engine, as the live Global Scheduler does it
(``global_scheduler/hibernation.py``, ``global_scheduler.hibernate_after_s``).

A session kernel (long-running replicas: ``notebookos``, ``reservation``) with no cell for
``SimConfig.hibernate_after_s`` stops all its replicas: they give back their hosts' subscription
and memory, and under a reservation the session's GPUs. Its next cell wakes it: the replicas are
placed again as at a start (which may wait for hosts or GPUs like a start), taken from the hosts'
prewarm pools where there are some, and the cell starts once the wake (``wake_s``, plus a cold
start's extra time for a replica that found no warm container) is over. Per-cell containers
(``batch``, ``lcp``) hold nothing between cells and never hibernate, as live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from notebookos.simulator.sessionsim import SessionSimulator, _Sess


class Hibernation:
    """The idle clock, hibernating and waking of the engine's session kernels."""

    def __init__(self, sim: SessionSimulator, event_kind: int) -> None:
        self.sim = sim
        self.after_s = sim.config.hibernate_after_s
        self.enabled = self.after_s > 0 and not sim.policy.lifetime.per_cell
        self.event_kind = event_kind

    def active(self, sess: _Sess, now: float) -> None:
        """The session's kernel became idle (up, or a cell ended): the idle clock restarts."""
        if not self.enabled:
            return
        sess.idle_token += 1
        self.sim._push(now + self.after_s, self.event_kind, (sess, sess.idle_token))

    @staticmethod
    def stale(sess: _Sess, token: int) -> bool:
        """A clock that no longer applies: a cell came since, one waits, or the session ended
        (the engine skips it without advancing its clock)."""
        return token != sess.idle_token or sess.ended or sess.kernel is None or not sess.ready \
            or sess.current is not None or bool(sess.queue) or sess.waiting

    def due(self, sess: _Sess, token: int, now: float) -> None:
        """The idle clock ran out: hibernate unless a cell came since (or one waits)."""
        if self.stale(sess, token):
            return
        sim = self.sim
        kernel = sess.kernel
        replicas = len(kernel.replicas)
        sim._books(now)
        if not sim.binding.binds_at_placement:
            sim._add_standby(-replicas, sess.s.request.gpus)
        sim.cluster.remove_kernel(kernel.kernel_id)  # subscriptions, memory, reserved GPUs
        integ = sim.record.integrals
        integ.replicas -= replicas
        integ.hibernated_replicas += replicas
        sess.kernel = None
        sess.ready = False
        sess.hibernated = replicas
        sess.last_exec = None  # the woken replicas are new ones
        sim.record.hibernations += 1
        sim.maybe_empty = True
        sim._refresh_books()
        sim._drain(now)

    def wake(self, sess: _Sess, now: float) -> None:
        """A cell arrived for a hibernated session: place its replicas again."""
        sess.wake_started = now
        sim = self.sim
        sim._books(now)
        sim.record.integrals.hibernated_replicas -= sess.hibernated
        sess.hibernated = 0
        sim._place_kernel(sess, now)  # waits (and retries) as a start does

    def latency(self, host_ids: list[str], now: float) -> float:
        """The wake of replicas on ``host_ids``: each takes a warm container where its host has
        one (the measured wake did); one that starts cold adds a cold start's extra time."""
        config = self.sim.config
        extra = max((self.sim._take_warm(h, now, config.prewarm_promotion_s)
                     - config.prewarm_promotion_s for h in host_ids), default=0.0)
        return config.wake_s + max(extra, 0.0)

    def woke(self, sess: _Sess, now: float) -> None:
        """The woken kernel is up: its waiting cell can start."""
        self.sim.record.wake_delays.append(now - sess.wake_started)
        sess.wake_started = None

    def ended(self, sess: _Sess, now: float) -> None:
        """The session ended while hibernated: nothing sleeps for it any more."""
        if sess.hibernated:
            self.sim._books(now)
            self.sim.record.integrals.hibernated_replicas -= sess.hibernated
            sess.hibernated = 0
