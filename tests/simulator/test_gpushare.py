"""The LithOS-style intra-GPU model: right-sizing by l(t) = m/t + b, and the ordering of the three
ways to share a GPU that LithOS reports (its p99 near running alone, MPS's far from it)."""

from __future__ import annotations

import pytest

from notebookos.simulator.gpushare import Kernel, capacity_saved, run


def test_latency_model_and_right_sizing_by_hand():
    k = Kernel(l1=0.054, lt=0.002, tpcs=54)  # m = 0.052 x 54 / 53, b = l1 - m
    assert k.latency(1) == pytest.approx(0.054) and k.latency(54) == pytest.approx(0.002)
    # slip 1.1 on 54 TPCs: l(t) <= 0.0022 -> t >= m / (0.0022 - b)
    t = k.right_size(54, 1.1)
    assert k.latency(t) <= 1.1 * k.latency(54) + 1e-12 < k.latency(t - 1)


def test_lithos_keeps_interactive_tails_near_alone_and_mps_does_not():
    results = {mode: run(mode, horizon_s=2.0, dt=5e-5) for mode in ("time_slicing", "mps",
                                                                  "lithos")}
    p99 = {mode: r["interactive_p99_vs_alone"] for mode, r in results.items()}
    assert p99["lithos"] < p99["time_slicing"] < p99["mps"]
    assert p99["lithos"] < 1.6
    for r in results.values():
        assert 0.5 < r["training_throughput_vs_alone"] <= 1.0  # work-conserving: training goes on


def test_right_sizing_saves_capacity_on_kernels_that_scale_poorly():
    poorly = (Kernel(l1=0.004, lt=0.001),) * 4  # b dominates: extra TPCs buy little
    assert capacity_saved(horizon_s=1.0, dt=5e-5, interactive=poorly) > 0.3
