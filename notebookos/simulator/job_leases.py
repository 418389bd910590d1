"""The job engine for policies that lease GPUs (``themis``).

A running job holds its GPUs for a lease of ``policy.lease_s``. Whenever GPUs are free and jobs
wait, or leases expire, the engine *offers* the free GPUs plus those of the expired leases to the
policy's ``allocate(candidates, offer_gpus, total_gpus, now)``, with the waiting jobs and the
expired jobs as candidates; it returns the jobs that hold GPUs for the next lease. An expired job
that is chosen again keeps running (its lease renews, no overhead); one that is not is preempted
(its progress kept, ``preemption_overhead_s`` added) and waits; a chosen waiting job starts. The
policy's own figures (``report()``) go into summary.json.

An overloaded trace has an auction at every lease end over thousands of waiting jobs, so the engine
keeps the candidates' columns (arrival, remaining work, GPUs, the active-jobs integral at arrival)
in arrays and hands a policy with ``allocate_seqs`` a ``LeaseCandidates`` table, with N_avg
computed for all of them at once; the waiting jobs are found through a mask in queue order when the
policy's queue order is fixed (it is for themis: arrival order), else from the queue itself.

With ``placement_slowdown = "model"`` the table also says, per candidate, the slowdown S of the
placement the offer gives it (``job_placement``): 1 when its gang fits in the largest block of
offered GPUs on one host (a host's idle GPUs plus those of its expired leases), else its model's
cross-host factor; and the chosen waiting jobs are placed largest first, each on one host by best
fit where one has room, so that the consolidated placements the bids counted on are the ones made.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from notebookos.policies.themis_auction import LeaseCandidates
from notebookos.simulator.jobsim import JobSimulator, _Job

LEASE_END = 6  # an event kind of this engine


class LeaseJobSimulator(JobSimulator):
    def __init__(self, workload, policy, config, progress=None) -> None:  # noqa: ANN001
        super().__init__(workload, policy, config, progress)
        self.lease_s = float(policy.lease_s)
        self.lease_end: dict[int, float] = {}
        self.expired: dict[int, None] = {}
        self.auctions = 0
        jobs = [j.q for j in self.jobs]
        self._submit = np.asarray([q.submit_time for q in jobs], dtype=float)
        self._duration = np.asarray([q.duration for q in jobs], dtype=float)
        self._gpus = np.asarray([q.num_gpus for q in jobs], dtype=np.int64)
        self._remaining = np.asarray([q.remaining for q in jobs], dtype=float)
        self._at_submit = np.zeros(len(jobs))  # the active-jobs integral at arrival
        # The queue order if it is fixed (each job's key as at time 0): rank -> seq, and which
        # ranks wait; a job enqueued under another key turns this off (the queue is read).
        keys = [(policy.priority_key(q, 0.0), q.seq) for q in jobs]
        self._static_key = [k for k, _ in keys]
        self._by_rank = np.asarray([s for _, s in sorted(keys)], dtype=np.int64)
        self._rank = np.empty(len(jobs), dtype=np.int64)
        self._rank[self._by_rank] = np.arange(len(jobs))
        self._waits = np.zeros(len(jobs), dtype=bool)  # by rank
        self._fixed_order = True
        self._queued = jobs
        self._factor = (None if self.spread_factor is None
                        else np.asarray(self.spread_factor, dtype=float))

    def n_avg(self, seq: int, submit: float, now: float) -> float:
        """The mean number of active jobs since ``seq`` arrived (exact, from the engine's books)."""
        integral = self._active_integral + self._active * (now - self._active_since)
        elapsed = now - submit
        if elapsed <= 0:
            return max(1.0, float(self._active))
        return max(1.0, (integral - self._integral_at_submit.get(seq, integral)) / elapsed)

    def _arrive(self, job: _Job, now: float) -> None:
        super()._arrive(job, now)
        at = self._integral_at_submit.get(job.q.seq)
        if at is not None:
            self._at_submit[job.q.seq] = at

    def _enqueue(self, job: _Job, now: float) -> None:
        super()._enqueue(job, now)
        seq = job.q.seq
        self._remaining[seq] = job.q.remaining
        self._waits[self._rank[seq]] = True
        if self._fixed_order and job.key != self._static_key[seq]:
            self._fixed_order = False

    def _unqueue(self, job: _Job) -> None:
        entry = (job.key, job.q.seq)
        del self.waiting[bisect.bisect_left(self.waiting, entry)]
        self._waits[self._rank[job.q.seq]] = False

    def _waiting_seqs(self) -> np.ndarray:
        """The waiting jobs' seqs in queue order."""
        if self._fixed_order:
            return self._by_rank[self._waits.nonzero()[0]]
        return np.fromiter((s for _, s in self.waiting), dtype=np.int64, count=len(self.waiting))

    def candidates(self, expired: list[_Job], now: float) -> LeaseCandidates:
        """The waiting jobs (queue order) and the expired leases, with N_avg as ``n_avg``."""
        seqs = self._waiting_seqs()
        if expired:
            for job in expired:
                self._remaining[job.q.seq] = job.q.remaining
            seqs = np.concatenate((seqs, [j.q.seq for j in expired]))
        integral = self._active_integral + self._active * (now - self._active_since)
        submit = self._submit[seqs]
        elapsed = now - submit
        if elapsed.min() > 0:
            n_avg = np.maximum(1.0, (integral - self._at_submit[seqs]) / elapsed)
        else:  # a job that arrived now: N_avg is the number active now
            with np.errstate(divide="ignore", invalid="ignore"):
                n_avg = np.maximum(1.0, (integral - self._at_submit[seqs]) / elapsed)
            n_avg[elapsed <= 0] = max(1.0, float(self._active))
        gpus = self._gpus[seqs]
        return LeaseCandidates(seqs, submit, self._remaining[seqs], self._duration[seqs],
                               gpus, n_avg, self._queued, self._offered_slowdown(seqs, gpus,
                                                                                 expired))

    def _offered_slowdown(self, seqs: np.ndarray, gpus: np.ndarray,
                          expired: list[_Job]) -> np.ndarray | None:
        """S of the placement the offer gives each candidate (None when placement is free)."""
        if self._factor is None:
            return None
        block = {host.host_id: host.idle_gpus for host in self.cluster.hosts.values()}
        for job in expired:
            for host, k in zip(job.hosts, job.counts, strict=True):
                block[host.host_id] += k
        largest = max(block.values(), default=0)
        return np.where(gpus <= largest, 1.0, self._factor[seqs])

    def _grant(self, job: _Job, now: float) -> None:
        self.lease_end[job.q.seq] = now + self.lease_s
        heapq.heappush(self.events, (now + self.lease_s, LEASE_END, job.q.seq, job.version))

    def _start(self, job: _Job, picks, now: float) -> None:  # noqa: ANN001
        super()._start(job, picks, now)
        self._grant(job, now)

    def _handle(self, kind: int, seq: int, version: int, now: float) -> None:
        if kind != LEASE_END:
            super()._handle(kind, seq, version, now)
            return
        job = self.jobs[seq]
        if job.running and version == job.version:
            self.expired[seq] = None

    def _complete(self, job: _Job, now: float) -> None:
        self.expired.pop(job.q.seq, None)
        self.lease_end.pop(job.q.seq, None)
        super()._complete(job, now)

    def _schedule(self, now: float) -> None:
        free = self.cluster.total_gpus - self.cluster.committed_gpus
        if not self.expired and (free <= 0 or not self.waiting):
            return
        expired = [self.jobs[s] for s in self.expired if self.jobs[s].running]
        self.expired.clear()
        for job in expired:
            self._sync(job, now)
        offer = free + sum(j.q.num_gpus for j in expired)
        if not self.waiting:  # nobody else wants GPUs: every lease simply renews
            for job in expired:
                self._grant(job, now)
            return
        self.auctions += 1
        allocate_seqs = getattr(self.policy, "allocate_seqs", None)
        if allocate_seqs is not None:
            chosen = set(allocate_seqs(self.candidates(expired, now), offer,
                                       self.cluster.total_gpus, now))
        else:
            candidates = [self.jobs[s].q for _, s in self.waiting] + [j.q for j in expired]
            chosen = {q.seq for q in self.policy.allocate(
                candidates, offer, self.cluster.total_gpus, now,
                n_avg={q.seq: self.n_avg(q.seq, q.submit_time, now) for q in candidates})}
            # (a plug-in's allocate is not given the offered placements' slowdowns)
        for job in expired:
            if job.q.seq in chosen:
                self._grant(job, now)
                chosen.discard(job.q.seq)
            else:
                self._stop(job, now)
                job.rec.preemptions += 1
                self.preemptions += 1
                job.q.remaining += self.config.preemption_overhead_s
                self._enqueue(job, now)
        if self._factor is None:
            order = sorted((self.jobs[s] for s in chosen), key=lambda j: (j.key, j.q.seq))
        else:  # largest first, so that the big gangs find whole hosts
            order = sorted((self.jobs[s] for s in chosen),
                           key=lambda j: (-j.q.num_gpus, j.key, j.q.seq))
        for job in order:
            picks = self._place(job)
            if picks is None:
                continue  # placement (consolidated) failed: it waits for the next offer
            self._unqueue(job)
            self._start(job, picks, now)

    def run(self):  # noqa: ANN201
        record = super().run()
        record.extra["auctions"] = self.auctions
        report = getattr(self.policy, "report", None)
        if report is not None:
            record.extra.update(report())
        return record
