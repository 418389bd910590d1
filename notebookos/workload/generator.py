"""A synthetic notebook workload calibrated to the Sensei statistics (traces/README.md, paper 2.3).

Written as a NotebookOS session template (ticks of 60 s), which the simulator and the live
workload driver read. Model (docs/simulator.md "Generator"):

- Sessions arrive as a Poisson process (``session_rate_per_hour``) and live a log-normal time
  (median ``session_hours_median``), cut at the end of the trace.
- A share ``idle_session_fraction`` of sessions never trains (Sensei: ~70% of GPUs idle for the
  whole session). Each session has a GPU count drawn from the Sensei week's mix
  (1: 58%, 4: 19%, 8: 23%).
- A training session alternates cells and idle gaps from the start until its end. Cell durations
  follow the Sensei CDF (50% <= 2 min, 75% <= 5, 90% <= 17, 95% <= 36, 99% <= 182 min); the gap
  between the end of a cell and the next submission follows the Sensei inter-arrival figures
  (shortest 4 min, median 5, 75% <= 8), with a tail of long breaks (``break_probability``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from notebookos.resources import ResourceSpec
from notebookos.workload.model import Session, Task, Workload

TICK_S = 60.0
# (cumulative probability, minutes) knots; log-linear between knots.
DURATION_KNOTS_MIN = ((0.0, 0.5), (0.5, 2.0), (0.75, 5.0), (0.90, 17.0), (0.95, 36.0),
                      (0.99, 182.0), (1.0, 600.0))
GAP_KNOTS_MIN = ((0.0, 4.0), (0.5, 5.0), (0.75, 8.0), (0.90, 15.0), (0.99, 45.0), (1.0, 90.0))
GPU_MIX = ((1, 0.578), (4, 0.191), (8, 0.231))


@dataclass(frozen=True)
class SenseiParams:
    hours: float
    seed: int = 0
    session_rate_per_hour: float = 5.2
    session_hours_median: float = 72.0
    session_hours_sigma: float = 1.0
    idle_session_fraction: float = 0.3
    break_probability: float = 0.05  # after a cell, the user leaves for a while
    break_hours_mean: float = 3.0

    def __post_init__(self) -> None:
        if not self.hours > 0:
            raise ValueError(f"hours={self.hours!r} must be > 0")
        if not 0 <= self.idle_session_fraction <= 1 or not 0 <= self.break_probability < 1:
            raise ValueError("idle_session_fraction must be in [0, 1], break_probability in [0, 1)")
        if self.session_rate_per_hour <= 0 or self.session_hours_median <= 0:
            raise ValueError("session_rate_per_hour and session_hours_median must be > 0")


def _quantile(knots: tuple[tuple[float, float], ...], u: float) -> float:
    for (p0, v0), (p1, v1) in zip(knots, knots[1:], strict=False):
        if u <= p1:
            f = 0.0 if p1 == p0 else (u - p0) / (p1 - p0)
            return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
    return knots[-1][1]


def generate_sensei(params: SenseiParams,
                    progress: Callable[[float], None] | None = None) -> dict:
    """The template as a dict (``sessions`` with ticks), deterministic for ``params.seed``.
    ``progress`` is told the trace hours generated so far, after every session."""
    rng = np.random.default_rng(params.seed)
    end_tick = int(math.ceil(params.hours * 3600 / TICK_S))
    sessions = []
    t_h = 0.0
    index = 0
    gpu_values = [g for g, _ in GPU_MIX]
    gpu_probs = np.array([p for _, p in GPU_MIX]) / sum(p for _, p in GPU_MIX)
    while True:
        t_h += rng.exponential(1.0 / params.session_rate_per_hour)
        if t_h >= params.hours:
            break
        life_h = float(np.exp(math.log(params.session_hours_median)
                              + params.session_hours_sigma * rng.standard_normal()))
        start = max(1, int(t_h * 60))
        stop = min(end_tick, start + max(1, int(life_h * 60)))
        gpus = int(rng.choice(gpu_values, p=gpu_probs))
        trainings = []
        if rng.random() >= params.idle_session_fraction:
            tick = start + int(math.ceil(_quantile(GAP_KNOTS_MIN, rng.random())))
            while True:
                duration = max(1, int(round(_quantile(DURATION_KNOTS_MIN, rng.random()))))
                if tick + duration > stop:
                    break
                trainings.append(_training(tick, duration, gpus))
                gap = _quantile(GAP_KNOTS_MIN, rng.random())
                if rng.random() < params.break_probability:
                    gap += rng.exponential(params.break_hours_mean * 60)
                tick += duration + max(4, int(round(gap)))
        sessions.append({
            "id": f"sensei-{params.seed}-{index:06d}",
            "start_tick": start,
            "stop_tick": stop,
            "num_training_events": len(trainings),
            "trainings": trainings,
        })
        index += 1
        if progress is not None:
            progress(t_h)
    return {
        "workloadTitle": f"sensei-synthetic-{params.hours:g}h-seed{params.seed}",
        "workloadSeed": params.seed,
        "timescaleAdjustmentFactor": 1.0,
        "numberOfSessions": len(sessions),
        "generator": {"kind": "sensei", **{k: v for k, v in params.__dict__.items()}},
        "sessions": sessions,
    }


def _training(tick: int, duration: int, gpus: int) -> dict:
    return {
        "start_tick": tick,
        "duration_in_ticks": duration,
        "millicpus": 1000 * gpus,
        "memory": 4096 * gpus,
        "vram": 8.0 * gpus,
        "gpus": gpus,
        "gpu_utilizations": [{"utilization": 100.0} for _ in range(gpus)],
    }


def write_sensei(params: SenseiParams, out: Path,
                 progress: Callable[[float], None] | None = None) -> dict:
    template = generate_sensei(params, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(template, separators=(",", ":")) + "\n")
    return template


def back_to_back(notebooks: list[tuple[str, str]], cells: int, cell_s: float,
                 gpus: int = 1) -> Workload:
    """Each (notebook, user) submits ``cells`` cells of ``cell_s`` seconds at time 0: they run
    one after another, as a notebook whose cells are run back to back (a contention input)."""
    request = ResourceSpec(100, 128, gpus, 0.0)
    return Workload(tuple(
        Session(name, 0.0, None, request,
                tuple(Task(f"{name}-{i}", name, 0.0, cell_s, request, user=user)
                      for i in range(cells)))
        for name, user in notebooks))
