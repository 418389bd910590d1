"""The live GPU sharing decision (notebookos.policies.gpu_sharing): both gSLAs, the predicted
slowdowns, pairs only, the measured default for unknown workloads."""

from __future__ import annotations

import pytest

from notebookos.policies.gpu_sharing import (
    UNKNOWN_PAIR_DELTA,
    GpuSharing,
    SharingParty,
    make_predictor,
)
from notebookos.policies.tensorshare import OraclePredictor
from notebookos.workload.interference import slowdown


@pytest.fixture(name="oracle", scope="module")
def oracle_fixture() -> GpuSharing:
    return GpuSharing("oracle")


def test_unknown_workloads_get_the_measured_default(oracle: GpuSharing) -> None:
    assert oracle.predict("", "resnet18") == (UNKNOWN_PAIR_DELTA, UNKNOWN_PAIR_DELTA)
    assert oracle.predict("my-llm", "") == (UNKNOWN_PAIR_DELTA, UNKNOWN_PAIR_DELTA)
    a, b = SharingParty("a", 2.0), SharingParty("b", 2.0)
    yes = oracle.decide(a, [b])
    assert yes.share and yes.delta_new == yes.delta_running == UNKNOWN_PAIR_DELTA
    assert "predicted slowdowns 1.72 for a (gpu_sla 2) and 1.72 for b" in yes.reason
    tight = oracle.decide(SharingParty("a", 1.5), [b])
    assert not tight.share and "would pass a gpu_sla" in tight.reason


def test_known_workloads_use_the_predictor(oracle: GpuSharing) -> None:
    assert oracle.predict("DQN", " a2c ") == (slowdown("dqn", "a2c"), slowdown("a2c", "dqn"))
    light = oracle.decide(SharingParty("a", 1.2, "dqn"), [SharingParty("b", 1.2, "a2c")])
    assert light.share, light.reason
    heavy = oracle.decide(SharingParty("a", 1.2, "vgg19"), [SharingParty("b", 3.0, "gpt2")])
    assert not heavy.share and heavy.delta_new > 1.2


def test_never_shares_without_both_slas(oracle: GpuSharing) -> None:
    sharer = SharingParty("b", 2.0)
    no = oracle.decide(SharingParty("a", 1.0), [sharer])
    assert not no.share and "a's gpu_sla is 1: it never shares" in no.reason
    no = oracle.decide(SharingParty("a", 2.0), [SharingParty("b", 1.0)])
    assert not no.share and "held by kernel b, whose gpu_sla is 1" in no.reason


def test_pairs_only_and_not_with_itself(oracle: GpuSharing) -> None:
    a = SharingParty("a", 3.0)
    no = oracle.decide(a, [SharingParty("b", 3.0), SharingParty("c", 3.0)])
    assert not no.share and "never 3 on one GPU" in no.reason
    assert not oracle.decide(a, [SharingParty("a", 3.0)]).share
    assert not oracle.decide(a, []).share


def test_memory_must_fit_the_device(oracle: GpuSharing) -> None:
    a, b = SharingParty("a", 2.0, vram_gb=10), SharingParty("b", 2.0, vram_gb=8)
    no = oracle.decide(a, [b], device_vram_gb=16)
    assert not no.share and "do not fit one 16 GB device" in no.reason
    assert oracle.decide(a, [b], device_vram_gb=80).share
    assert oracle.decide(a, [b]).share  # the device's memory unknown: not checked


def test_choose_takes_the_least_slowed_devices(oracle: GpuSharing) -> None:
    me = SharingParty("me", 3.0, "dqn")
    devices = {0: [SharingParty("heavy", 3.0, "vgg19")], 1: [SharingParty("light", 3.0, "ppo")],
               2: [SharingParty("never", 1.0)], 3: []}
    ids, decisions, refused = oracle.choose(me, devices, 1)
    assert ids == [1] and decisions[0].share
    assert refused == ["GPU 2: held by kernel never, whose gpu_sla is 1: it never shares a GPU"]
    assert oracle.choose(me, devices, 2)[0] == [1, 0]
    assert oracle.choose(me, devices, 3)[0] == []
    with pytest.raises(ValueError, match="gpus=0"):
        oracle.choose(me, devices, 0)


def test_predictors_and_bad_input() -> None:
    name, predictor = make_predictor("ridge")
    assert name == "ridge" and predictor.predict("dqn", "vgg19")[0] >= 1.0
    assert make_predictor("blind")[1].predict("vgg19", "gpt2") == (1.0, 1.0)
    assert GpuSharing(OraclePredictor()).predictor_name == "OraclePredictor"
    with pytest.raises(ValueError, match="not one of auto, mlp, ridge, oracle, blind"):
        GpuSharing("lstm")
    with pytest.raises(ValueError, match="must be a slowdown >= 1"):
        GpuSharing("oracle", unknown_delta=0.5)
