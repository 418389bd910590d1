"""Binding the request's GPUs around one cell, through ``gpu_binding`` (the pure module).

``execute_request`` metadata carries ``gpu_device_ids``. Before the cell the ids are exposed to
user code (``notebookos.kernel.gpu_binding.assigned_gpus()``) and, when CUDA is available, the
namespace's torch modules, tensors and optimizer states move to ``cuda:<first id>``; after the cell
they move back to host memory so standbys and checkpoints read host memory. Without CUDA the ids
are virtual and nothing moves.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any


def requested_gpu_ids(metadata: dict[str, Any]) -> tuple[int, ...]:
    """The request's ``gpu_device_ids`` as a tuple of ints; bad values raise ValueError."""
    ids = metadata.get("gpu_device_ids") or []
    if not isinstance(ids, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise ValueError(f"gpu_device_ids must be a list of non-negative ints, got {ids!r}")
    return tuple(ids)


class GpuGlue:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._moved = False

    def _module(self):
        try:
            from . import gpu_binding
        except ImportError as exc:
            self.log.error("GPU binding unavailable (notebookos.kernel.gpu_binding): %s", exc)
            return None
        return gpu_binding

    def bind(self, namespace: MutableMapping[str, Any], metadata: dict[str, Any]) -> None:
        gpu_binding = self._module()
        if gpu_binding is None:
            return
        try:
            ids = requested_gpu_ids(metadata)
        except ValueError as exc:
            self.log.error("ignoring the request's GPU ids: %s", exc)
            ids = ()
        gpu_binding.set_assigned_gpus(ids)
        self._moved = False
        if ids and gpu_binding.cuda_available():
            moved = gpu_binding.move_namespace_to_device(namespace, f"cuda:{ids[0]}")
            self._moved = True
            self.log.info("bound GPUs %s: moved %d objects to cuda:%d", ids, moved, ids[0])

    def unbind(self, namespace: MutableMapping[str, Any]) -> None:
        gpu_binding = self._module()
        if gpu_binding is None:
            return
        if self._moved or gpu_binding.cuda_available():
            gpu_binding.move_namespace_to_host(namespace)
            self._moved = False
        gpu_binding.set_assigned_gpus(())
