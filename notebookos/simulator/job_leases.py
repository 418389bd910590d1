"""The job engine for policies that lease GPUs (``themis``).

A running job holds its GPUs for a lease of ``policy.lease_s``. Whenever GPUs are free and jobs
wait, or leases expire, the engine *offers* the free GPUs plus those of the expired leases to the
policy's ``allocate(candidates, offer_gpus, total_gpus, now)``, with the waiting jobs and the
expired jobs as candidates; it returns the jobs that hold GPUs for the next lease. An expired job
that is chosen again keeps running (its lease renews, no overhead); one that is not is preempted
(its progress kept, ``preemption_overhead_s`` added) and waits; a chosen waiting job starts. The
policy's own figures (``report()``) go into summary.json.
"""

from __future__ import annotations

import heapq

from notebookos.simulator.jobsim import JobSimulator, _Job

LEASE_END = 6  # an event kind of this engine


class LeaseJobSimulator(JobSimulator):
    def __init__(self, workload, policy, config, progress=None) -> None:  # noqa: ANN001
        super().__init__(workload, policy, config, progress)
        self.lease_s = float(policy.lease_s)
        self.lease_end: dict[int, float] = {}
        self.expired: dict[int, None] = {}
        self.auctions = 0

    def n_avg(self, seq: int, submit: float, now: float) -> float:
        """The mean number of active jobs since ``seq`` arrived (exact, from the engine's books)."""
        integral = self._active_integral + self._active * (now - self._active_since)
        elapsed = now - submit
        if elapsed <= 0:
            return max(1.0, float(self._active))
        return max(1.0, (integral - self._integral_at_submit.get(seq, integral)) / elapsed)

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
        waiting = [self.jobs[s] for _, s in self.waiting]
        offer = free + sum(j.q.num_gpus for j in expired)
        if not waiting:  # nobody else wants GPUs: every lease simply renews
            for job in expired:
                self._grant(job, now)
            return
        self.auctions += 1
        candidates = [j.q for j in waiting] + [j.q for j in expired]
        chosen = {q.seq for q in self.policy.allocate(
            candidates, offer, self.cluster.total_gpus, now,
            n_avg={q.seq: self.n_avg(q.seq, q.submit_time, now) for q in candidates})}
        for job in expired:
            if job.q.seq in chosen:
                self._grant(job, now)
            else:
                self._stop(job, now)
                job.rec.preemptions += 1
                self.preemptions += 1
                job.q.remaining += self.config.preemption_overhead_s
                self._enqueue(job, now)
        for job in waiting:
            if job.q.seq not in chosen:
                continue
            picks = self._place(job)
            if picks is None:
                continue  # placement (consolidated) failed: it waits for the next offer
            self.waiting.remove((job.key, job.q.seq))
            self._start(job, picks, now)

    def run(self):  # noqa: ANN201
        record = super().run()
        record.extra["auctions"] = self.auctions
        report = getattr(self.policy, "report", None)
        if report is not None:
            record.extra.update(report())
        return record
