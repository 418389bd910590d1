"""The job engine for Muri's "themis" (Gavel's finish-time fairness, issue 35).

Muri's simulator (Rivendile/Muri ``simulator/run_sim.py``, ``themis_sim_jobs``) publishes the
"themis" figures that docs/evaluation.md compares against. Its loop, which this engine follows:

- It schedules only at an arrival or a real completion (an "event"). At each event, every job
  that was running since the last one has run ``dt`` more seconds of wall time
  (``total_executed_time``) and made ``max(dt - overhead, 0)`` seconds of progress, the overhead
  being the profiled restart cost of its model and size (``overhead_dict``, 4-46 s, 10 s for an
  unknown model): charged to every running job at every event, restarted or not.
- Over every job present (waiting and running) it solves Gavel's max-min finish-time-fairness
  problem (``notebookos.policies.gavel_ftf``) with Muri's inputs: elapsed time since submission,
  remaining iterations, throughput 1 / iteration time, the GPUs of the job and of the cluster, and
  an isolated finish time that, as Muri computes it, is in iterations over the isolated share
  (``get_isolated_throughputs`` returns the share ``min(ceil(G/n)/s, 1)``, not the throughput;
  ``units="gavel"`` multiplies by the throughput as Gavel does).
- It orders the jobs by x / executed time, never-run jobs first by x (x * 1e9), ties by the
  deficit (the time x says the job should have had, minus what it had), then by x; Python's sort
  is stable, so remaining ties keep the order of the job list, which after each event is sorted
  by GPUs, largest first, with new jobs at the end.
- YARN placement on an emptied cluster, twice: in that order, a job takes the first host with
  room (at most a host's GPUs) or whole free hosts (larger jobs), and is skipped when none fits;
  the jobs chosen are then placed for real, largest first. Chosen running jobs keep running
  (their hosts may change; that costs nothing here, as there), running jobs not chosen are
  preempted.

The iteration times come from the trace (Muri's ``iterations`` and ``iteration_time``, which the
``muri`` reader keeps on each task): a job is ``iterations`` steps of ``iteration_time`` x the
policy's ``iteration_factor`` (Muri's 1.015, ``jobs.py``), and its work their product, not the
trace's rounded ``duration``. A caller may pass ``iteration_s`` per job instead (its workload's
durations are then taken as they are). A job the trace gives no steps is one step a second of its
duration (Muri's and Gavel's units then coincide). Placement is Muri's YARN whatever
``SimConfig.placement`` says: a job of at most a host's GPUs on one host (the fullest that
fits) or it waits, a larger one over the most idle hosts.
"""

from __future__ import annotations

import math
import time

import numpy as np

from notebookos.policies import placement
from notebookos.policies.base import Policy
from notebookos.policies.gavel_ftf import GavelFTF, ftf_allocation
from notebookos.simulator.config import SimConfig
from notebookos.simulator.jobsim import ARRIVE, COMPLETE, TICK, JobSimulator, _Job
from notebookos.workload.model import Workload

__all__ = ["DEFAULT_OVERHEAD_S", "OVERHEAD_S", "FTFJobSimulator", "GavelFTF", "MuriEvents"]

# Muri simulator/run_sim.py: profiled start overhead (seconds) by GPUs and model.
OVERHEAD_S: dict[int, dict[str, float]] = {
    1: {"vgg16": 7, "vgg19": 7, "resnet18": 4, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10,
        "a2c": 38, "dqn": 5},
    2: {"vgg16": 7, "vgg19": 7, "resnet18": 5, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10,
        "a2c": 39, "dqn": 5},
    4: {"vgg16": 8, "vgg19": 8, "resnet18": 5, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10,
        "a2c": 39, "dqn": 6},
    8: {"vgg16": 9, "vgg19": 9, "resnet18": 7, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10,
        "a2c": 46, "dqn": 6},
    16: {"vgg16": 9, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 7, "bert": 10, "gpt2": 10,
         "a2c": 46, "dqn": 8},
    32: {"vgg16": 10, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 8, "bert": 10,
         "gpt2": 10, "a2c": 46, "dqn": 8},
}
DEFAULT_OVERHEAD_S = 10.0


class MuriEvents(JobSimulator):
    """Schedules only where Muri's simulator does: at arrivals and real completions (and the
    engine's ticks); a subclass's ``_schedule`` runs when ``_live_at`` is the current instant."""

    _live_at = -1.0

    def _handle(self, kind: int, seq: int, version: int, now: float) -> None:
        if kind == ARRIVE or (kind == COMPLETE and version == self.jobs[seq].version
                              and self.jobs[seq].running):
            self._live_at = now
        elif kind == TICK:
            self._live_at = now
        super()._handle(kind, seq, version, now)

class FTFJobSimulator(MuriEvents):
    """Muri's ``themis_sim_jobs`` on the job engine (module docstring)."""

    placement_name = "yarn"  # what summaries report: SimConfig.placement does not apply

    def __init__(self, workload: Workload, policy: Policy, config: SimConfig,
                 progress=None, *, solver: str | None = None,  # noqa: ANN001
                 units: str | None = None, iteration_s: list[float] | None = None,
                 overhead: bool | None = None) -> None:
        """``solver``, ``units``, ``overhead``: the policy's (``GavelFTF``) unless given."""
        super().__init__(workload, policy, config, progress)
        self.solver = solver or getattr(policy, "ftf_solver", "center")
        self.units = units or getattr(policy, "ftf_units", "muri")
        if units not in (None, "muri", "gavel"):
            raise ValueError(f"units: muri or gavel, not {units!r}")
        self.overhead = getattr(policy, "ftf_overhead", True) if overhead is None else overhead
        if iteration_s is None:
            iteration_s = self._trace_steps(workload, getattr(policy, "iteration_factor", 1.0))
        self.iteration_s = iteration_s
        self._last_event = 0.0
        self._runnable: list[int] = []  # Muri's JOBS.runnable_jobs, in its order
        self._executed: dict[int, float] = {}
        self._should: dict[int, float] = {}
        self._isolated: dict[int, float] = {}  # cumulative isolated time
        self._steps_prev: dict[int, float] = {}
        self._share_prev: dict[int, float] = {}
        self.solves = 0
        self.solve_wall_s = 0.0

    def _trace_steps(self, workload: Workload, factor: float) -> list[float]:
        """Seconds a step per job; a job with the trace's steps gets its work from them."""
        steps = []
        for job, task in zip(self.jobs, workload.tasks, strict=True):
            if task.iterations > 0 and task.iteration_s > 0:
                step = task.iteration_s * factor
                job.q.duration = job.q.remaining = job.rec.duration = task.iterations * step
                steps.append(step)
            else:
                steps.append(1.0)
        return steps

    def _place(self, job: _Job):  # noqa: ANN202
        """Muri's YARN: a job of at most a host's GPUs on one host, else whole hosts first."""
        need = job.q.num_gpus
        if need > self.cluster.total_gpus - self.cluster.committed_gpus:
            return None
        if need <= self.gpus_per_host:
            for host in placement.fewest_idle_first(self.cluster, min_idle=need, limit=1):
                return [(host, need)]
            return None
        return self._spread(need)

    def _arrive(self, job: _Job, now: float) -> None:
        super()._arrive(job, now)
        if job.q.num_gpus <= self.max_job_gpus():
            self._runnable.append(job.q.seq)
            self._executed[job.q.seq] = 0.0
            self._should[job.q.seq] = 0.0

    def _complete(self, job: _Job, now: float) -> None:
        super()._complete(job, now)
        self._runnable.remove(job.q.seq)

    def _overhead(self, job: _Job) -> float:
        if not self.overhead:
            return 0.0
        return float(OVERHEAD_S.get(job.q.num_gpus, {}).get(job.q.name, DEFAULT_OVERHEAD_S))

    def _schedule(self, now: float) -> None:
        if self._live_at != now:
            return
        dt = now - self._last_event
        for job in list(self.running.values()):
            self._sync(job, now)
            self._executed[job.q.seq] += dt
            job.q.remaining += min(self._overhead(job), dt)
        if self._runnable:
            self._solve_and_run(now, dt)
        self._last_event = now

    def _solve_and_run(self, now: float, dt: float) -> None:
        seqs = self._runnable
        n = len(seqs)
        total = self.cluster.total_gpus
        s = np.array([self.jobs[q].q.num_gpus for q in seqs], dtype=float)
        share = np.minimum(math.ceil(total / n) / s, 1.0)
        step = np.array([self.iteration_s[q] for q in seqs])
        steps = np.array([self.jobs[q].q.remaining for q in seqs]) / step
        tput = 1.0 / step
        isolated_rate = share if self.units == "muri" else share * tput
        elapsed = np.array([now - self.jobs[q].q.submit_time for q in seqs])
        isolated = np.empty(n)
        for i, q in enumerate(seqs):
            done = self._isolated.get(q, 0.0)
            if q in self._steps_prev:
                done += (self._steps_prev[q] - steps[i]) / self._share_prev[q]
            self._isolated[q] = done
            isolated[i] = done + steps[i] / isolated_rate[i]
            self._steps_prev[q] = steps[i]
            self._share_prev[q] = isolated_rate[i]
        wall = time.perf_counter()
        x = ftf_allocation(elapsed, steps, tput, isolated, s, float(total), self.solver)
        self.solve_wall_s += time.perf_counter() - wall
        self.solves += 1
        keys = {}
        for i, q in enumerate(seqs):
            executed = self._executed[q]
            sort_val = x[i] * 1e9 if executed == 0 else x[i] / executed
            deficit = self._should[q] - executed
            self._should[q] += x[i] * dt
            keys[q] = (sort_val, deficit, x[i])
        order = sorted(seqs, key=keys.__getitem__, reverse=True)
        chosen = self._yarn_choice(order)
        self._runnable = sorted(order, key=lambda q: self.jobs[q].q.num_gpus, reverse=True)
        for q in list(self.running):
            job = self.jobs[q]
            self._stop(job, now)
            if q not in chosen:
                job.rec.preemptions += 1
                self.preemptions += 1
        self.waiting = []
        for q in self._runnable:
            job = self.jobs[q]
            picks = self._place(job) if q in chosen else None
            if picks is None:
                self.waiting.append(((q,), q))
            else:
                self._start(job, picks, now)
        self.waiting.sort()

    def _yarn_choice(self, order: list[int]) -> set[int]:
        """Muri's first pass: YARN first fit on an emptied cluster, in the order, skipping."""
        per_host = self.gpus_per_host
        free = [per_host] * len(self.cluster.hosts)
        chosen: set[int] = set()
        for q in order:
            need = self.jobs[q].q.num_gpus
            if need <= per_host:
                for h, idle in enumerate(free):
                    if idle >= need:
                        free[h] -= need
                        chosen.add(q)
                        break
                continue
            whole, rest = divmod(need, per_host)
            empty = [h for h, idle in enumerate(free) if idle == per_host]
            if len(empty) < whole:
                continue
            taken = empty[:whole]
            last = None
            if rest:
                last = next((h for h, idle in enumerate(free)
                             if h not in taken and idle >= rest), None)
                if last is None:
                    continue
            for h in taken:
                free[h] = 0
            if last is not None:
                free[last] -= rest
            chosen.add(q)
        return chosen

    def run(self):  # noqa: ANN201
        record = super().run()
        record.extra["ftf_solves"] = self.solves
        record.extra["ftf_solve_wall_s"] = round(self.solve_wall_s, 2)
        return record
