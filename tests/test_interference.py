"""The synthetic job profiles and pair slowdowns behind tensorshare and lucid."""

from __future__ import annotations

import numpy as np

from notebookos.workload import interference as inter


def test_slowdowns_are_calibrated_to_the_papers_v100_statistics():
    deltas = np.array([[inter.slowdown(a, b) for b in inter.TYPES] for a in inter.TYPES])
    assert len(inter.TYPES) == 29  # TensorShare's Table 1 has 29 job types
    assert abs(deltas.mean() - 1.54) < 0.01 and abs(deltas.std() - 0.49) < 0.01
    assert deltas.min() >= 1.0 and deltas.max() <= inter.MAX_SLOWDOWN


def test_light_jobs_barely_interfere_and_heavy_ones_do():
    assert inter.slowdown("a2c", "dqn") < 1.2  # Lucid: low-utilisation pairs keep > 0.85x speed
    assert inter.slowdown("vgg19", "gpt2") > 2.0
    assert inter.mean_speed_when_shared("ppo") > inter.mean_speed_when_shared("vgg19")


def test_unknown_names_get_a_stable_profile():
    a, b = inter.profile("my-model"), inter.profile("my-model")
    assert a == b and 0 < a.sm_active < 1 and a.memory_gb > 0
    assert inter.profile("") == inter.profile("")
    assert not inter.fits_together("gpt2", "bert")  # 14 + 13 GB on a 16-GB V100
    assert inter.fits_together("dqn", "a2c")
