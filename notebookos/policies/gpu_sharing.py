"""Live GPU sharing (TensorShare, seed 001): may a cell share a GPU with the one running cell there?

The live Global Scheduler asks this when a cell's GPUs cannot be committed exclusively on its
replicas' hosts and ``global_scheduler.gpu_sharing = "tensorshare"``. Pure: it gets who asks and
who holds the device, and answers yes or no with the predicted slowdowns and a reason.

- Each kernel carries its gSLA (``KernelHints.gpu_sla``, from its kernelspec): the largest
  slowdown its cells accept against a dedicated GPU; 1 never shares.
- A device takes at most two cells (TensorShare's pairs): one holding it alone may be joined by
  one other, never three.
- The slowdowns of the pair come from TensorShare's predictor (``notebookos.policies.tensorshare``:
  ``mlp``, ``ridge``, ``oracle``, ``blind``) when both workloads (``KernelHints.gpu_workload``) are
  types the predictor knows (``notebookos.workload.interference.TYPES``); a pair with an unknown or
  unnamed workload gets ``UNKNOWN_PAIR_DELTA`` for both, the slowdown measured live on an H100
  with two CNN training loops time-sliced on one GPU (docs/evaluation.md), a conservative figure:
  a kernel whose gSLA is below it shares only with known, lighter workloads.
- Both must stay within their gSLA, and their GPU memory requests (when given) must fit the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from notebookos.workload.interference import TYPES

# Two CIFAR CNN training loops time-sliced on one NVIDIA H100 80GB HBM3 slowed each other by this
# much (benchmarks/gpu_sharing.py --seconds 10 --warmup-s 15, docs/evaluation.md); 1.38 under MPS
# at 50% each.
UNKNOWN_PAIR_DELTA = 1.72
PREDICTORS = ("auto", "mlp", "ridge", "oracle", "blind")
MAX_SHARERS = 2
_KNOWN = frozenset(TYPES)


class Predictor(Protocol):
    def predict(self, a: str, b: str) -> tuple[float, float]: ...


@dataclass(frozen=True, slots=True)
class SharingParty:
    """A kernel whose cell asks for, or holds, a GPU."""

    kernel_id: str
    gpu_sla: float = 1.0
    workload: str = ""
    vram_gb: float = 0.0  # the kernel's GPU memory request per GPU; 0 = not given

    @property
    def shares(self) -> bool:
        return self.gpu_sla > 1.0


@dataclass(frozen=True, slots=True)
class SharingDecision:
    share: bool
    reason: str
    delta_new: float = 1.0  # predicted slowdown of the cell that asks
    delta_running: float = 1.0  # predicted slowdown of the cell that holds the device


def make_predictor(name: str, *, seed: int = 0, epochs: int = 1000) -> tuple[str, Predictor]:
    """(the predictor's name, the predictor); ``auto`` is ``mlp`` with torch, else ``ridge``."""
    from notebookos.policies import tensorshare

    if name not in PREDICTORS:
        raise ValueError(f"GPU sharing predictor {name!r} is not one of {', '.join(PREDICTORS)}")
    if name == "auto":
        try:
            import torch  # noqa: F401 - only whether it is there
        except ImportError:
            name = "ridge"
        else:
            name = "mlp"
    if name == "mlp":
        return name, tensorshare.MLPPredictor(epochs=epochs, seed=seed)
    if name == "ridge":
        return name, tensorshare.RidgePredictor(seed=seed)
    if name == "oracle":
        return name, tensorshare.OraclePredictor()
    return name, tensorshare.BlindPredictor()


class GpuSharing:
    """TensorShare's pairing rule for the live scheduler: ``decide`` one device, ``choose`` among
    several."""

    name = "tensorshare"

    def __init__(self, predictor: str | Predictor = "auto", *,
                 unknown_delta: float = UNKNOWN_PAIR_DELTA, seed: int = 0) -> None:
        if not unknown_delta >= 1.0:
            raise ValueError(f"unknown_delta={unknown_delta!r} must be a slowdown >= 1")
        if isinstance(predictor, str):
            self.predictor_name, self.predictor = make_predictor(predictor, seed=seed)
        else:
            self.predictor_name, self.predictor = type(predictor).__name__, predictor
        self.unknown_delta = float(unknown_delta)
        self._pairs: dict[tuple[str, str], tuple[float, float]] = {}

    def predict(self, a: str, b: str) -> tuple[float, float]:
        """(delta of ``a``, delta of ``b``) when they share a GPU."""
        a, b = a.strip().lower(), b.strip().lower()
        if a not in _KNOWN or b not in _KNOWN:
            return self.unknown_delta, self.unknown_delta
        value = self._pairs.get((a, b))
        if value is None:
            da, db = self.predictor.predict(a, b)
            value = self._pairs[(a, b)] = (max(1.0, float(da)), max(1.0, float(db)))
        return value

    def decide(self, cell: SharingParty, holders: Sequence[SharingParty],
               device_vram_gb: float = 0.0) -> SharingDecision:
        """May ``cell`` join a device ``holders`` hold now?"""
        if not cell.shares:
            return SharingDecision(False, f"kernel {cell.kernel_id}'s gpu_sla is "
                                   f"{cell.gpu_sla:g}: it never shares a GPU")
        if not holders:
            return SharingDecision(False, "the device is free: nothing to share")
        if len(holders) >= MAX_SHARERS:
            return SharingDecision(False, f"already shared by {len(holders)} kernels (never "
                                   f"{MAX_SHARERS + 1} on one GPU)")
        other = holders[0]
        if other.kernel_id == cell.kernel_id:
            return SharingDecision(False, "held by the same kernel")
        if not other.shares:
            return SharingDecision(False, f"held by kernel {other.kernel_id}, whose gpu_sla is "
                                   f"{other.gpu_sla:g}: it never shares a GPU")
        if device_vram_gb > 0 and cell.vram_gb > 0 and other.vram_gb > 0 \
                and cell.vram_gb + other.vram_gb > device_vram_gb + 1e-9:
            return SharingDecision(False, f"{cell.vram_gb:g} + {other.vram_gb:g} GB of GPU memory "
                                   f"do not fit one {device_vram_gb:g} GB device")
        d_new, d_run = self.predict(cell.workload, other.workload)
        verdict = (f"predicted slowdowns {d_new:.2f} for {cell.kernel_id} (gpu_sla "
                   f"{cell.gpu_sla:g}) and {d_run:.2f} for {other.kernel_id} (gpu_sla "
                   f"{other.gpu_sla:g})")
        if d_new > cell.gpu_sla or d_run > other.gpu_sla:
            return SharingDecision(False, f"sharing with kernel {other.kernel_id} would pass a "
                                   f"gpu_sla: {verdict}", d_new, d_run)
        return SharingDecision(True, verdict, d_new, d_run)

    def choose(self, cell: SharingParty, devices: dict[int, Sequence[SharingParty]], gpus: int,
               device_vram_gb: dict[int, float] | None = None
               ) -> tuple[list[int], list[SharingDecision], list[str]]:
        """Which ``gpus`` of ``devices`` (device id -> its holders) ``cell`` may join: the
        accepted devices of least predicted total slowdown (TensorShare's S1 rule), their
        decisions, and why the others were refused. Empty when fewer than ``gpus`` qualify."""
        if gpus < 1:
            raise ValueError(f"gpus={gpus} must be >= 1 to share a GPU")
        vram = device_vram_gb or {}
        accepted: list[tuple[float, int, SharingDecision]] = []
        refused: list[str] = []
        for device_id, holders in sorted(devices.items()):
            decision = self.decide(cell, holders, vram.get(device_id, 0.0))
            if decision.share:
                accepted.append((decision.delta_new + decision.delta_running, device_id,
                                 decision))
            elif holders:
                refused.append(f"GPU {device_id}: {decision.reason}")
        if len(accepted) < gpus:
            return [], [], refused
        accepted.sort(key=lambda t: (t[0], t[1]))
        picked = accepted[:gpus]
        return [d for _, d, _ in picked], [x for _, _, x in picked], refused
