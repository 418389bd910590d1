"""Placement sensitivity for the job engine: a job whose GPUs span several hosts runs slower.

A data-parallel job synchronises its gradients every iteration; inside one host that goes over
NVLink/PCIe, across hosts over the network, so a spread job's iterations take longer by a factor
that depends on the model: communication-heavy models (many or large parameters against little
compute per sample: VGG, AlexNet, BERT, GPT-2) slow down a lot, compute-bound ones (ResNet,
Inception, ShuffleNet) little, and the small reinforcement-learning models of the Muri traces
(A2C, DQN) not measurably. Sources of the factors (``CROSS_HOST``, one step "same host ->
several hosts", no rack level: our clusters are one switch):

- Themis (seed 004, section 2 and Table 1): VGG16 on 4 P100s runs 103.6 images/s on one server,
  80.4 across two: 1.29x. Its footnote 3: the slowdown S(G) Themis starts from before it learns
  one is 1.1 across machines and 1.3 across racks, the ``DEFAULT`` here for a model we have no
  figure for.
- Tiresias (NSDI'19, its profile-based placement) and the simulators built on it (SymbioticLab/Tiresias,
  Rivendile/Muri ``simulator/models.py``): the models whose tensor sizes are skewed (VGG, AlexNet:
  one large fully-connected layer) are the ones that need consolidation; ResNet and Inception,
  many small tensors, run about as fast spread. Tiresias consolidates only such jobs; the
  ``sensitive`` placement does the same with ``SENSITIVE`` as its threshold.
- BERT and GPT-2 (110-124 M parameters, all-reduced every step with little compute per sample
  at the traces' small batches) are put with VGG: our assumption, not a measurement.

Neither Muri's nor Tiresias's published simulator slows a spread job (they place jobs with YARN's
consolidating placement and charge a restart overhead at every rescheduling instead); this module
is Themis's model of the effect. It is off unless ``SimConfig.placement_slowdown`` is ``model``
(``notebookos simulate --placement-slowdown model``), so the earlier figures stay reproducible.
"""

from __future__ import annotations

SLOWDOWN_MODES = ("off", "model")

#: A job spread over more than one host runs this many times slower (per model name, lower case).
CROSS_HOST: dict[str, float] = {
    "vgg11": 1.25,
    "vgg16": 1.29,  # Themis Table 1: 103.6 / 80.4 images/s
    "vgg19": 1.30,
    "alexnet": 1.30,
    "bert": 1.25,
    "gpt2": 1.30,
    "resnet18": 1.05,
    "resnet50": 1.05,
    "resnet101": 1.08,
    "resnet152": 1.10,
    "inception3": 1.05,
    "inception4": 1.08,
    "shufflenet_v2_x1_0": 1.05,
    "a2c": 1.0,
    "dqn": 1.0,
}

#: Themis's starting value for a cross-machine placement (footnote 3).
DEFAULT = 1.1

#: Models at least this sensitive are consolidated by the ``sensitive`` placement (Tiresias).
SENSITIVE = 1.2


def cross_host_factor(model: str) -> float:
    """The slowdown of ``model`` when its GPUs span hosts (``DEFAULT`` for an unknown name)."""
    return CROSS_HOST.get((model or "").strip().lower(), DEFAULT)


def slowdown(model: str, hosts: int) -> float:
    """The slowdown of a job of ``model`` whose GPUs are on ``hosts`` hosts (1 on one host)."""
    return 1.0 if hosts <= 1 else cross_host_factor(model)


def is_sensitive(model: str) -> bool:
    return cross_host_factor(model) >= SENSITIVE
