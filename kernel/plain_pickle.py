"""Unpickling plain data only: builtin containers and scalars, never a class or a function."""

from __future__ import annotations

import pickle
from typing import Any


class PlainUnpickler(pickle.Unpickler):
    """Builtin containers and scalars only: any class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: plain data only")
