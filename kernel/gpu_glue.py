"""Binding the request's GPUs around one cell, through ``gpu_binding`` (the pure module).

``execute_request`` metadata carries ``gpu_device_ids``. Before the cell the ids are exposed to
user code (``notebookos.kernel.gpu_binding.assigned_gpus()``) and, when CUDA is available, the
namespace's torch modules, tensors and optimizer states move to ``cuda:<first id>``; after the cell
they move back to host memory so standbys and checkpoints read host memory. Without CUDA the ids
are virtual and nothing moves.
"""

from __future__ import annotations

import logging
import sys
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


def gpu_ids_usable(ids: tuple[int, ...], cuda: bool, device_count: int) -> bool:
    """Whether this host can bind ``ids``: virtual ids always can; real ones must exist."""
    return not cuda or all(i < device_count for i in ids)


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

    def can_lead(self, metadata: dict[str, Any]) -> bool:
        """False when the request names GPUs this host does not have (then the replica YIELDs)."""
        try:
            ids = requested_gpu_ids(metadata)
        except ValueError:
            return True  # bind() reports it; the cell runs without GPUs
        if not ids:
            return True
        gpu_binding = self._module()
        if gpu_binding is None or not gpu_binding.cuda_available():
            return True
        import torch

        usable = gpu_ids_usable(ids, True, torch.cuda.device_count())
        if not usable:
            self.log.error("request names GPUs %s; this host has %d: yielding",
                           ids, torch.cuda.device_count())
        return usable

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
            try:
                moved = gpu_binding.move_namespace_to_device(namespace, f"cuda:{ids[0]}")
            except Exception as exc:  # noqa: BLE001 - an invisible device, CUDA out of memory
                # The move puts back what it had moved before raising; the cell still runs.
                self.log.error("could not bind GPUs %s: %s", ids, exc)
                print(f"NotebookOS warning: could not move this notebook's torch state to "
                      f"cuda:{ids[0]} ({type(exc).__name__}: {exc}); it stays in host memory "
                      "for this cell.", file=sys.stderr)
                return
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
