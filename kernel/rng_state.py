"""The global random generators' states: part of what a cell leaves behind.

``np.random.seed(0)`` in one cell and ``np.random.rand(2)`` in the next must give plain IPython's
numbers even when the second cell runs on another replica (after a failover). So after every cell
the executor captures the states of the process-wide generators, and a standby sets them when it
applies the update (docs/state-sync.md, "Global random generators"):

- Python's ``random`` module (its hidden ``random.Random`` instance);
- NumPy's legacy global ``RandomState`` (``np.random.seed``, ``np.random.rand``, ...);
- torch's CPU generator (``torch.manual_seed``), and its CUDA generators where CUDA is in use.

Generators the user holds in variables (``np.random.default_rng(0)``, ``random.Random(1)``,
``torch.Generator()``) are values of the namespace and travel like any other.

The captured state is plain data (ints, tuples, bytes, str): it is pickled with the protocol the
update's restricted unpickler reads, so applying it runs no code. A module the executor never
imported is not captured; capturing never imports one.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import random
import sys
from collections.abc import Iterator
from typing import Any

from notebookos.kernel.plain_pickle import PlainUnpickler

RNG_ROOT = "\0rng"  # the entry name under which the generators' states are synced
DISPLAY_NAME = "the global random generators (random, numpy.random, torch)"


def is_rng_root(name: str) -> bool:
    return name == RNG_ROOT


def capture() -> dict[str, Any]:
    """The current states of the global generators of every module already imported."""
    state: dict[str, Any] = {"random": random.getstate()}
    # numpy.random itself, not numpy: numpy imports it lazily, and a notebook that never used it
    # has drawn nothing from it (asking would import it into every replica)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "get_state"):
        kind, keys, pos, has_gauss, cached = numpy_random.get_state(legacy=True)
        state["numpy"] = (str(kind), keys.tobytes(), str(keys.dtype), int(pos), int(has_gauss),
                          float(cached))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        state["torch"] = bytes(torch.get_rng_state().numpy().tobytes())
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            state["cuda"] = [bytes(s.numpy().tobytes()) for s in cuda.get_rng_state_all()]
    return state


class Baseline:
    """The generators' states when a replica started, one digest each, so that a notebook that
    never draws a random number never sends them. A generator first seen later (its module was
    imported since) counts as changed: the cell that imported it may have seeded it."""

    def __init__(self) -> None:
        self._digests = _digests(capture())

    def unchanged(self, state: dict[str, Any]) -> bool:
        return _digests(state) == self._digests


def _digests(state: dict[str, Any]) -> dict[str, int]:
    return {key: hash(pickle.dumps(value, protocol=5)) for key, value in state.items()}


def to_bytes(state: dict[str, Any]) -> bytes:
    return pickle.dumps(state, protocol=5)


def from_bytes(data: bytes) -> dict[str, Any]:
    state = PlainUnpickler(io.BytesIO(data)).load()
    if not isinstance(state, dict):
        raise ValueError("malformed random generator state")
    return state


def restore(state: dict[str, Any]) -> None:
    """Set the global generators to ``state`` (from ``capture`` on another replica).

    Imports numpy or torch when the state names them and this replica has not imported them yet
    (the executor had: the namespace holds them too). CUDA states are set lazily by torch, when
    CUDA is first used here.
    """
    if "random" in state:
        random.setstate(_tuples(state["random"]))
    if "numpy" in state:
        import numpy

        kind, keys, dtype, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, numpy.frombuffer(keys, dtype=dtype).copy(), pos, has_gauss,
                                cached))
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(
                [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in state["cuda"]])


@contextlib.contextmanager
def users_generator_untouched() -> Iterator[None]:
    """Put Python's global generator back as it was after the block: for the kernel's own code
    that draws from it. IPython's banner picks a random tip with ``random.choice``
    (IPython/core/tips.py), and every ``kernel_info_request`` builds the banner: the one the
    scheduler sends to a woken kernel took one of the user's numbers, so the first
    ``random.random()`` after a wake was plain IPython's next-but-one (issue 31)."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


def _tuples(value: Any) -> Any:
    """``random.setstate`` wants tuples; a state that went through a list-making codec is fixed."""
    if isinstance(value, list | tuple):
        return tuple(_tuples(item) for item in value)
    return value
