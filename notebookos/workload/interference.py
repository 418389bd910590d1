"""What a job does to a GPU, and what two jobs sharing one GPU do to each other.

The seeds' sharing schedulers (TensorShare, seed 001; Lucid, seed 002 ch. 4) learn from profiles
measured on real GPUs (DCGM metrics of a job run alone) and from measured slowdowns of job pairs;
neither data set is public. This module *synthesises* both, once, for every job type named in the
shared traces (the Tiresias/Muri ``model_name`` column) and a dozen more so that a predictor sees
29 types as TensorShare's did (its Table 1):

- ``profile(name)``: the solo profile: SM_ACTIVE, SM_OCCUPANCY, DRAM_ACTIVE, PCIE_RX (fractions,
  as DCGM reports them) and GPU memory (GB). Known models have hand-set values in the order the
  literature reports (VGG/BERT/GPT-2 saturate SMs and memory bandwidth; DQN/A2C/PPO barely use the
  GPU); an unknown name gets a deterministic profile drawn from a hash of the name.
- ``slowdown(a, b)``: delta_a = JCT of ``a`` sharing a GPU with ``b`` / JCT of ``a`` alone, the
  "ground truth" of the simulator: 1 + K x (contention)^P + a fixed per-pair perturbation (what
  the four metrics do not explain), clipped to [1, 3.7] (TensorShare's largest measured slowdown).
  Contention = SM_a SM_b + 0.6 DRAM_a DRAM_b + 0.4 PCIE_a PCIE_b + 0.2 OCC_b. K and P are chosen
  so that over the 29 x 29 ordered pairs the mean is 1.54 and the standard deviation 0.49, the
  V100 figures of TensorShare (Fig. 12); low-utilisation pairs stay above 0.85x speed as Lucid
  measured (sec. 4.2.2), saturating pairs approach 2x and beyond.

Nothing here is random at run time: the same name always gets the same profile and slowdowns.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class Profile:
    """A job's solo profile (DCGM averages over a few iterations) and its GPU memory."""

    name: str
    sm_active: float
    sm_occupancy: float
    dram_active: float
    pcie_rx: float
    memory_gb: float

    @property
    def features(self) -> tuple[float, float, float, float]:
        """The four metrics TensorShare keeps (sec. 3.1), in its order."""
        return (self.sm_active, self.sm_occupancy, self.dram_active, self.pcie_rx)


# name: (SM_ACTIVE, SM_OCCUPANCY, DRAM_ACTIVE, PCIE_RX, GPU memory GB). The first 17 are every
# model named in ../shared/traces (Sensei week, Philly/Muri traces 1-4); the rest complete 29 types.
KNOWN_PROFILES: dict[str, tuple[float, float, float, float, float]] = {
    "vgg11": (0.85, 0.45, 0.55, 0.30, 9.0),
    "vgg16": (0.90, 0.50, 0.60, 0.30, 11.0),
    "vgg19": (0.92, 0.50, 0.62, 0.30, 12.0),
    "alexnet": (0.55, 0.30, 0.40, 0.60, 3.0),
    "resnet18": (0.60, 0.35, 0.45, 0.35, 4.0),
    "resnet50": (0.80, 0.45, 0.55, 0.30, 8.0),
    "resnet101": (0.85, 0.50, 0.50, 0.25, 10.0),
    "resnet152": (0.88, 0.50, 0.50, 0.25, 12.0),
    "inception3": (0.75, 0.40, 0.45, 0.30, 8.0),
    "inception4": (0.80, 0.45, 0.50, 0.28, 10.0),
    "shufflenet_v2_x1_0": (0.35, 0.25, 0.30, 0.45, 3.0),
    "gpt2": (0.90, 0.55, 0.70, 0.15, 14.0),
    "bert": (0.88, 0.55, 0.65, 0.15, 13.0),
    "dqn": (0.25, 0.15, 0.20, 0.30, 2.0),
    "a2c": (0.20, 0.12, 0.18, 0.35, 1.5),
    "mobilenet_v2": (0.40, 0.30, 0.35, 0.40, 4.0),
    "densenet121": (0.70, 0.40, 0.55, 0.30, 7.0),
    "lstm": (0.50, 0.30, 0.60, 0.20, 5.0),
    "transformer": (0.85, 0.50, 0.65, 0.20, 11.0),
    "ncf": (0.30, 0.20, 0.50, 0.25, 2.0),
    "pointnet": (0.30, 0.20, 0.25, 0.20, 2.0),
    "ppo": (0.18, 0.10, 0.15, 0.30, 1.5),
    "cyclegan": (0.80, 0.45, 0.60, 0.20, 9.0),
    "yolov3": (0.82, 0.50, 0.55, 0.35, 10.0),
    "unet": (0.70, 0.40, 0.60, 0.25, 8.0),
    "efficientnet_b0": (0.50, 0.35, 0.45, 0.35, 6.0),
    "wideresnet50": (0.90, 0.50, 0.60, 0.25, 14.0),
    "deepspeech2": (0.65, 0.40, 0.50, 0.40, 9.0),
    "dlrm": (0.45, 0.30, 0.70, 0.55, 12.0),
}
TYPES: tuple[str, ...] = tuple(KNOWN_PROFILES)
GPU_MEMORY_GB = 16.0  # a V100-16GB (TensorShare's GPU): two jobs share one only when both fit

# Calibration of slowdown(): solved once so that the 29 x 29 ordered pairs have mean 1.54 and
# standard deviation 0.49 (tests/test_interference.py checks it).
K = 1.1200
P = 2.6412
MAX_SLOWDOWN = 3.7
PAIR_NOISE = 0.06  # std of the per-pair perturbation the metrics do not explain


def _unit(text: str, salt: str) -> float:
    """A deterministic number in [0, 1) from ``text``."""
    digest = hashlib.blake2b(f"{salt}:{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@lru_cache(maxsize=4096)
def profile(name: str) -> Profile:
    """The solo profile of a job type; unknown (or empty) names get a deterministic one."""
    key = (name or "").strip().lower()
    if key in KNOWN_PROFILES:
        return Profile(key, *KNOWN_PROFILES[key])
    sm = 0.15 + 0.8 * _unit(key, "sm")
    return Profile(key, sm, 0.1 + 0.5 * sm * (0.6 + 0.4 * _unit(key, "occ")),
                   0.1 + 0.7 * _unit(key, "dram"), 0.1 + 0.5 * _unit(key, "pcie"),
                   round(1.0 + 14.0 * _unit(key, "mem"), 1))


def contention(a: Profile, b: Profile) -> float:
    """How much ``b`` gets in ``a``'s way (0 for two idle jobs; about 1.6 for two saturating)."""
    return (a.sm_active * b.sm_active + 0.6 * a.dram_active * b.dram_active
            + 0.4 * a.pcie_rx * b.pcie_rx + 0.2 * b.sm_occupancy)


def _pair_noise(a: str, b: str) -> float:
    """A fixed standard-normal draw per ordered pair (Box-Muller on two hashes)."""
    u1 = max(1e-12, _unit(f"{a}|{b}", "n1"))
    u2 = _unit(f"{a}|{b}", "n2")
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@lru_cache(maxsize=65536)
def slowdown(a: str, b: str) -> float:
    """delta of job type ``a`` when it shares one GPU with job type ``b`` (>= 1)."""
    pa, pb = profile(a), profile(b)
    delta = 1.0 + K * contention(pa, pb) ** P + PAIR_NOISE * _pair_noise(pa.name, pb.name)
    return min(MAX_SLOWDOWN, max(1.0, delta))


def fits_together(a: str, b: str, gpu_memory_gb: float = GPU_MEMORY_GB) -> bool:
    return profile(a).memory_gb + profile(b).memory_gb <= gpu_memory_gb


def mean_speed_when_shared(name: str, partners: tuple[str, ...] = TYPES) -> float:
    """Average normalised speed (1/delta) of ``name`` over ``partners``: Lucid's sharing
    measurement behind its Tiny/Medium/Jumbo classes (sec. 4.3.2)."""
    return sum(1.0 / slowdown(name, p) for p in partners) / len(partners)
