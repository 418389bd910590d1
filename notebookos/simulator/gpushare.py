"""A LithOS-style model of several kernels sharing one GPU (seed 003), against time slicing and
MPS-style sharing.

One GPU of ``tpcs`` TPCs (an A100 has 54) runs a high-priority stream (an interactive cell:
requests arriving at random, each a sequence of GPU kernels) beside a best-effort stream (a
training job: kernels back to back). A kernel's latency on t TPCs is l(t) = m/t + b (LithOS's
right-sizing model, sec. 5.5, fitted from its latency alone and on all TPCs); its progress rate on
t TPCs is 1/l(t) of the kernel per second. The modes differ only in how the TPCs are shared:

- ``time_slicing``: one context owns the whole GPU for a slice (``slice_s``); a request that
  arrives during the other's slice waits for it to end;
- ``mps``: both run at once on half the TPCs each, and a high-priority kernel first waits for the
  best-effort thread blocks already resident to drain (one block's time: head-of-line blocking);
- ``lithos``: TPC quotas (``hp_quota`` of the TPCs for the interactive stream, the rest for
  training), work-conserving stealing (an idle quota is lent), atomised long kernels (a stolen TPC
  is given back within one atom, ``atom_s``, 250-500 us in the paper), and right-sizing: an
  interactive kernel uses the fewest TPCs t with l(t) <= ``slip`` x l(quota), the rest going to
  training (capacity saved).

``run(mode, ...)`` returns the interactive requests' latency normalised to running alone (p50,
p99), the training stream's throughput normalised to running alone, and the TPC-time the
interactive stream used. The simulator does not co-locate two kernels' replicas on one GPU today
(NotebookOS binds GPUs exclusively, as the paper's prototype does); this model says what sharing
would cost an interactive cell, and ``python -m notebookos.simulator.gpushare`` prints the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MODES = ("time_slicing", "mps", "lithos")
ALONE = "alone"  # the interactive stream on the whole GPU, no training: the baseline


@dataclass(frozen=True)
class Kernel:
    l1: float  # latency on one TPC (s)
    lt: float  # latency on all TPCs (s)
    tpcs: int = 54

    @property
    def m(self) -> float:
        return (self.l1 - self.lt) * self.tpcs / (self.tpcs - 1)

    @property
    def b(self) -> float:
        return self.l1 - self.m

    def latency(self, t: float) -> float:
        return self.m / max(t, 1e-9) + self.b

    def right_size(self, allocation: float, slip: float) -> float:
        """The fewest TPCs t with l(t) <= slip x l(allocation) (LithOS 5.5)."""
        target = slip * self.latency(allocation)
        if target <= self.b:
            return allocation
        return float(min(allocation, max(1, math.ceil(self.m / (target - self.b)))))


# An interactive cell: 8 small kernels (about 1 ms each on the whole GPU, scaling well); a training
# job: long kernels (8 ms on the whole GPU) that LithOS splits into atoms.
INTERACTIVE = (Kernel(l1=0.030, lt=0.0010),) * 8
TRAINING = Kernel(l1=0.30, lt=0.008)


def run(mode: str, *, tpcs: int = 54, rate_per_s: float = 20.0, horizon_s: float = 10.0,
        interactive: tuple[Kernel, ...] = INTERACTIVE, training: Kernel = TRAINING,
        hp_quota: float = 0.75, slice_s: float = 0.002, atom_s: float = 0.0004,
        slip: float = 1.1, right_sizing: bool = True, dt: float = 2.5e-5,
        seed: int = 0) -> dict:
    """Simulate ``horizon_s`` of the two streams under ``mode``; returns the figures."""
    if mode not in (*MODES, ALONE):
        raise ValueError(f"mode {mode!r} must be one of {', '.join(MODES)}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=int(rate_per_s * horizon_s * 2)))
    arrivals = [float(a) for a in arrivals if a < horizon_s]
    solo = sum(k.latency(tpcs) for k in interactive)
    queue: list[float] = list(arrivals)
    latencies: list[float] = []
    hp_started = None  # arrival time of the request in service
    hp_kernel, hp_progress, hp_wait = 0, 0.0, 0.0
    be_done, be_progress = 0.0, 0.0
    hp_tpc_s = 0.0
    t = 0.0
    block_s = training.latency(tpcs) / 4  # MPS: a resident training block's time (4 waves)
    while t < horizon_s:
        if hp_started is None and queue and queue[0] <= t:
            hp_started = queue.pop(0)
            hp_kernel, hp_progress = 0, 0.0
            hp_wait = {"time_slicing": 0.0, "mps": block_s, "lithos": atom_s, ALONE: 0.0}[mode]
        hp_active = hp_started is not None
        t_hp = t_be = 0.0
        be_slice = mode == "time_slicing" and (t // slice_s) % 2 == 1
        if not hp_active:
            t_be = tpcs
        elif hp_wait > 0 or be_slice:
            hp_wait -= dt
            t_be = tpcs if mode != "lithos" else tpcs * (1 - hp_quota)
        else:
            kernel = interactive[hp_kernel]
            if mode in ("time_slicing", ALONE):
                t_hp = tpcs
            elif mode == "mps":
                t_hp = t_be = tpcs / 2
            else:
                share = tpcs * hp_quota
                t_hp = kernel.right_size(share, slip) if right_sizing else share
                t_be = tpcs - t_hp
            hp_tpc_s += t_hp * dt
            hp_progress += dt / kernel.latency(t_hp)
            if hp_progress >= 1.0:
                hp_kernel += 1
                hp_progress = 0.0
                if hp_kernel == len(interactive):
                    latencies.append(t + dt - hp_started)
                    hp_started = None
                elif mode == "mps":
                    hp_wait = block_s  # each kernel queues behind resident blocks again
        if t_be > 0 and mode != ALONE:
            be_progress += dt / training.latency(t_be)
            if be_progress >= 1.0:
                be_done += 1
                be_progress -= 1.0
        t += dt
    lat = np.asarray(latencies) if latencies else np.asarray([np.nan])
    be_alone = horizon_s / training.latency(tpcs)
    result = {"mode": mode, "requests": len(latencies),
              "interactive_p50_s": float(np.percentile(lat, 50)),
              "interactive_p99_s": float(np.percentile(lat, 99)),
              "solo_request_s": solo,
              "training_throughput_vs_alone": round((be_done + be_progress) / be_alone, 3),
              "interactive_tpc_seconds": round(hp_tpc_s, 4)}
    if mode != ALONE:
        alone = run(ALONE, tpcs=tpcs, rate_per_s=rate_per_s, horizon_s=horizon_s,
                    interactive=interactive, training=training, dt=dt, seed=seed)
        result["interactive_p50_vs_alone"] = round(result["interactive_p50_s"]
                                                   / alone["interactive_p50_s"], 3)
        result["interactive_p99_vs_alone"] = round(result["interactive_p99_s"]
                                                   / alone["interactive_p99_s"], 3)
    return result


def capacity_saved(**kwargs) -> float:
    """Share of the interactive stream's TPC-time that right-sizing gives back (LithOS's
    "capacity savings", at a latency slip of ``slip``)."""
    kwargs.pop("right_sizing", None)
    sized = run("lithos", right_sizing=True, **kwargs)["interactive_tpc_seconds"]
    full = run("lithos", right_sizing=False, **kwargs)["interactive_tpc_seconds"]
    return round(1.0 - sized / full, 4) if full else 0.0


def table(**kwargs) -> list[dict]:
    rows = [run(mode, **kwargs) for mode in MODES]
    rows[-1]["capacity_saved"] = capacity_saved(**kwargs)
    return rows


if __name__ == "__main__":  # pragma: no cover - a report
    for row in table():
        print(row)
