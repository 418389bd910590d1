"""Resource requests and capacities: ``ResourceSpec``.

A ``ResourceSpec`` is an immutable bundle of millicpus, memory (MB), GPUs and GPU memory (GB). It is
used both as a kernel's request and as a host's capacity or usage. Construction validates every
field, so a spec that exists is always well formed: non-negative integers for millicpus, memory_mb
and gpus, and a finite non-negative number for vram_gb.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


class InvalidResourceSpec(ValueError):
    """A resource field has a value that is not allowed. The message names field, value and rule."""


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    millicpus: int = 0
    memory_mb: int = 0
    gpus: int = 0
    vram_gb: float = 0.0

    def __post_init__(self) -> None:
        for name in ("millicpus", "memory_mb", "gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidResourceSpec(
                    f"resource {name}={value!r} is not allowed: expected a non-negative integer"
                )
            if value < 0:
                raise InvalidResourceSpec(
                    f"resource {name}={value!r} is not allowed: expected a non-negative integer"
                )
        vram = self.vram_gb
        if isinstance(vram, bool) or not isinstance(vram, int | float):
            raise InvalidResourceSpec(
                f"resource vram_gb={vram!r} is not allowed: expected a non-negative number"
            )
        if not math.isfinite(vram) or vram < 0:
            raise InvalidResourceSpec(
                f"resource vram_gb={vram!r} is not allowed: expected a finite non-negative number"
            )
        object.__setattr__(self, "vram_gb", float(vram))

    @classmethod
    def _trusted(cls, millicpus: int, memory_mb: int, gpus: int, vram_gb: float) -> ResourceSpec:
        """Build from fields already known valid (arithmetic on valid specs), skipping checks.

        Accounting does this arithmetic on every commit and release; validation would be a third
        of a simulation's time.
        """
        spec = object.__new__(cls)
        object.__setattr__(spec, "millicpus", millicpus)
        object.__setattr__(spec, "memory_mb", memory_mb)
        object.__setattr__(spec, "gpus", gpus)
        object.__setattr__(spec, "vram_gb", vram_gb)
        return spec

    # -- arithmetic -------------------------------------------------------------------------

    def __add__(self, other: ResourceSpec) -> ResourceSpec:
        if not isinstance(other, ResourceSpec):
            return NotImplemented
        return ResourceSpec._trusted(
            self.millicpus + other.millicpus,
            self.memory_mb + other.memory_mb,
            self.gpus + other.gpus,
            self.vram_gb + other.vram_gb,
        )

    def __sub__(self, other: ResourceSpec) -> ResourceSpec:
        """Difference; raises InvalidResourceSpec when any field would go negative."""
        if not isinstance(other, ResourceSpec):
            return NotImplemented
        vram = self.vram_gb - other.vram_gb
        if -1e-9 < vram < 0:  # float noise from repeated add/sub of the same values
            vram = 0.0
        m, mem, g = (self.millicpus - other.millicpus, self.memory_mb - other.memory_mb,
                     self.gpus - other.gpus)
        if m < 0 or mem < 0 or g < 0 or vram < 0:
            return ResourceSpec(m, mem, g, vram)  # raises, naming the negative field
        return ResourceSpec._trusted(m, mem, g, vram)

    def scaled(self, factor: int) -> ResourceSpec:
        """This spec times a non-negative integer (e.g. the request of R replicas)."""
        if factor < 0:
            raise InvalidResourceSpec(f"scale factor {factor!r} is not allowed: must be >= 0")
        return ResourceSpec(
            self.millicpus * factor, self.memory_mb * factor, self.gpus * factor,
            self.vram_gb * factor,
        )

    def fits_within(self, capacity: ResourceSpec) -> bool:
        """Whether every field of this spec is at most the same field of ``capacity``."""
        return (
            self.millicpus <= capacity.millicpus
            and self.memory_mb <= capacity.memory_mb
            and self.gpus <= capacity.gpus
            and self.vram_gb <= capacity.vram_gb + 1e-9
        )

    def shortfall(self, capacity: ResourceSpec) -> list[str]:
        """Human-readable list of the fields where this spec exceeds ``capacity``."""
        out = []
        for f in fields(self):
            want, have = getattr(self, f.name), getattr(capacity, f.name)
            if want > have + (1e-9 if f.name == "vram_gb" else 0):
                out.append(f"{f.name} {want} > {have}")
        return out

    @property
    def is_zero(self) -> bool:
        return self == ZERO

    # -- conversion -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResourceSpec:
        """Build from a mapping; unknown keys are an error, missing keys default to zero."""
        if not isinstance(data, Mapping):
            raise InvalidResourceSpec(f"resource request {data!r} is not allowed: expected a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidResourceSpec(
                f"resource request has unknown field(s) {unknown}: allowed are {sorted(known)}"
            )
        return cls(**dict(data))

    def __str__(self) -> str:
        return (
            f"{self.millicpus}m CPU, {self.memory_mb} MB, {self.gpus} GPU, "
            f"{self.vram_gb:g} GB VRAM"
        )


ZERO = ResourceSpec()
