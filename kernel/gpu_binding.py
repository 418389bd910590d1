"""Dynamic GPU binding: move the notebook's torch state to the cell's GPU and back.

GPUs are bound to the executor replica only while a cell runs. Before the cell the replica calls
``set_assigned_gpus(ids)`` and ``move_namespace_to_device(namespace, f"cuda:{ids[0]}")``; after
it, ``move_namespace_to_host(namespace)`` so checkpoints and standbys read host memory.

User code reads the ids with::

    from notebookos.kernel.gpu_binding import assigned_gpus, assigned_device
    assigned_gpus()    # e.g. (2,): the GPU ids bound for the running cell; () when none
    assigned_device()  # "cuda:2" when CUDA is available and a GPU is bound, else "cpu"

What moves (top-level names, and the same inside a list, tuple or dict one level deep):
``torch.nn.Module`` (parameters, buffers and their gradients), tensors, and optimizers (their
parameters and each per-parameter state tensor such as ``exp_avg``; a scalar ``step`` stays on the
CPU as torch keeps it, unless the group is ``capturable`` or ``fused``). Tensors held deeper, or
as attributes of other objects, do not move.

Identity is kept: a tensor is moved in place (``tensor.data = moved``) when torch allows it, as
``nn.Module.to`` does; when it does not, a new tensor is made once and every name, container,
module and optimizer that held the old one gets the same new one.

torch is never imported here: without ``torch`` in ``sys.modules`` the notebook holds no torch
objects and nothing moves. On a host without CUDA the ids are virtual and nothing moves.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

from notebookos.kernel.sync_codec import is_internal_name

log = logging.getLogger(__name__)

_assigned: tuple[int, ...] = ()
_assigned_lock = threading.Lock()


def _torch() -> Any:
    return sys.modules.get("torch")


def cuda_available() -> bool:
    """True when torch is loaded and sees a CUDA device; False when torch is absent or CPU-only."""
    torch = _torch()
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install means no CUDA
        return False


def set_assigned_gpus(ids: Sequence[int]) -> None:
    """Record the GPU ids bound for the cell about to run (``()`` after it ends)."""
    checked = []
    for gpu in ids:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise ValueError(f"GPU ids must be non-negative integers, got {gpu!r} in {ids!r}")
        checked.append(gpu)
    global _assigned
    with _assigned_lock:
        _assigned = tuple(checked)


def assigned_gpus() -> tuple[int, ...]:
    """The GPU ids bound for the running cell (virtual ids on a host without CUDA)."""
    return _assigned


def assigned_device() -> str:
    """``"cuda:<first id>"`` when CUDA is available and a GPU is bound, else ``"cpu"``."""
    ids = _assigned
    return f"cuda:{ids[0]}" if ids and cuda_available() else "cpu"


def move_namespace_to_device(namespace: MutableMapping[str, Any], device: str) -> int:
    """Move the namespace's torch modules, tensors and optimizer state to ``device``.

    Returns how many objects moved (a module counts once; each tensor outside a module once).
    A ``cuda`` device on a host without CUDA is virtual: nothing moves and 0 is returned.
    If the move fails part-way (CUDA out of memory), what moved is moved back to the host and the
    error is raised.
    """
    torch = _torch()
    if torch is None:
        return 0
    target = torch.device(device)
    if target.type == "cuda":
        if not cuda_available():
            return 0
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise ValueError(
                f"GPU {target.index} is not visible to this replica "
                f"({torch.cuda.device_count()} CUDA device(s); check CUDA_VISIBLE_DEVICES)"
            )
    try:
        return _Mover(torch, target).move_namespace(namespace)
    except Exception:
        # E.g. CUDA out of memory half-way: bring back what moved, so the cell can run on the host
        # state it expects; then let the caller report the error.
        if target.type != "cpu":
            try:
                move_namespace_to_host(namespace)
            except Exception:  # noqa: BLE001 - the original error is the one to report
                log.exception("moving the namespace back to the host after a failed move failed")
        raise


def move_namespace_to_host(namespace: MutableMapping[str, Any]) -> int:
    """Move everything ``move_namespace_to_device`` moves back to host memory (``cpu``)."""
    torch = _torch()
    if torch is None:
        return 0
    return _Mover(torch, torch.device("cpu")).move_namespace(namespace)


@contextlib.contextmanager
def bound_gpus(namespace: MutableMapping[str, Any], ids: Sequence[int]) -> Iterator[int]:
    """Bind ``ids`` around a cell: assign, move to the first GPU, yield the count, move back."""
    set_assigned_gpus(ids)
    try:
        moved = move_namespace_to_device(namespace, f"cuda:{ids[0]}") if ids else 0
        yield moved
    finally:
        try:
            if cuda_available():
                move_namespace_to_host(namespace)
        finally:
            set_assigned_gpus(())


class _Mover:
    """One move of a namespace. ``replaced`` maps id(old tensor) -> the tensor that replaces it."""

    def __init__(self, torch: Any, target: Any) -> None:
        self.torch = torch
        self.target = target
        self.replaced: dict[int, Any] = {}
        self._keep_alive: list[Any] = []  # old tensors: their ids must not be reused meanwhile
        self.moved = 0

    def move_namespace(self, namespace: MutableMapping[str, Any]) -> int:
        torch = self.torch
        names = [n for n in list(namespace) if not is_internal_name(n)]
        # Modules first (their parameters define the replacements), then optimizers, then tensors.
        for kind, move in (
            (torch.nn.Module, self._module),
            (torch.optim.Optimizer, self._optimizer),
            (torch.Tensor, self.tensor),
        ):
            for name in names:
                value = namespace.get(name)
                if isinstance(value, kind):
                    replacement = move(value)
                    if replacement is not value:
                        namespace[name] = replacement
                elif isinstance(value, list | tuple | dict):
                    replacement = self._container(value, kind, move)
                    if replacement is not value:
                        namespace[name] = replacement
        return self.moved

    # ---- containers, one level deep

    def _container(self, value: Any, kind: type, move: Any) -> Any:
        if isinstance(value, dict):
            for key, item in list(value.items()):
                if isinstance(item, kind):
                    replacement = move(item)
                    if replacement is not item:
                        value[key] = replacement
            return value
        if isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, kind):
                    replacement = move(item)
                    if replacement is not item:
                        value[index] = replacement
            return value
        items = [move(item) if isinstance(item, kind) else item for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)

    # ---- tensors

    def tensor(self, tensor: Any) -> Any:
        known = self.replaced.get(id(tensor))
        if known is not None:
            return known
        if tensor.device == self.target:
            return tensor
        torch = self.torch
        with torch.no_grad():
            data = tensor.data.to(self.target)
            if torch._has_compatible_shallow_copy_type(tensor, data):
                tensor.data = data  # in place: every holder sees the move
                result = tensor
            elif isinstance(tensor, torch.nn.Parameter):
                result = torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
            else:
                result = tensor.to(self.target)
            if tensor.grad is not None:
                grad = tensor.grad.to(self.target)
                if result is tensor:
                    tensor.grad = None  # the old grad is on the old device
                result.grad = grad
        self._replace(tensor, result)
        self.moved += 1
        return result

    def _replace(self, old: Any, new: Any) -> None:
        self.replaced[id(old)] = new
        if new is not old:
            self._keep_alive.append(old)

    # ---- modules

    def _module(self, module: Any) -> Any:
        slots = [
            (owner, table, key, tensor)
            for owner in module.modules()
            for table in (owner._parameters, owner._buffers)
            for key, tensor in table.items()
            if tensor is not None
        ]
        # Tensors already replaced (tied with another module moved earlier) are swapped in first.
        for _owner, table, key, tensor in slots:
            known = self.replaced.get(id(tensor))
            if known is not None and known is not tensor:
                table[key] = known
        if all(table[key].device == self.target for _o, table, key, _t in slots):
            return module
        module.to(self.target)
        for _owner, table, key, old in slots:
            new = table[key]
            if id(old) not in self.replaced:
                self._replace(old, new)
        self.moved += 1
        return module

    # ---- optimizers

    def _optimizer(self, optimizer: Any) -> Any:
        group_of: dict[int, dict] = {}
        for group in optimizer.param_groups:
            group["params"] = [self.tensor(p) for p in group["params"]]
            for param in group["params"]:
                group_of[id(param)] = group
        new_state: defaultdict[Any, dict] = defaultdict(dict)
        for param, state in optimizer.state.items():
            param = self.tensor(param) if isinstance(param, self.torch.Tensor) else param
            group = group_of.get(id(param), {})
            keep_step_on_cpu = not (group.get("capturable") or group.get("fused"))
            for key, value in list(state.items()):
                if not isinstance(value, self.torch.Tensor):
                    continue
                if key == "step" and keep_step_on_cpu and self.target.type != "cpu":
                    continue
                state[key] = self.tensor(value)
            new_state[param] = state
        optimizer.state = new_state  # re-keyed: a parameter may have been replaced
        return optimizer
