"""Encode the names a cell changed into a replicable update; apply updates; checkpoints.

The executor calls ``StateEncoder.encode(namespace, effects)`` after each cell. Each changed name
becomes a ``SyncEntry``:

- ``inline``: the serialised value travels in the Raft log (``payload``);
- ``pointer``: the serialised value is in the large-object store under
  ``{kernel_id}/objects/{digest}``; only the key travels;
- ``module``: an imported module, re-imported by name on the standby (never pickled);
- ``deleted``: the name is gone.

Values are serialised with cloudpickle (notebook functions and classes go by value, rebound to the
standby's namespace). Torch tensors, and plain numpy arrays over ``TENSOR_INLINE_LIMIT`` bytes,
are pulled out of every value by the pickler (``reducer_override``) and serialised on their own, each
under a *token* that names that tensor object for as long as it lives. A standby keeps a table
token -> tensor object, so an ``nn.Module`` and the optimizer built from its parameters still share
those parameter objects after both are applied, and ``opt.step()`` (which changes the parameters in
place but names only ``opt``) updates the model on the standby too: the changed parameters are
copied into the existing objects (and every synced entry holding a changed tensor is refreshed in
the same update, so entries never disagree about a tensor's bytes). A tensor whose version counter, data pointer, shape, dtype and
device are unchanged since it was last serialised is not serialised or hashed again. Tensors over
``TENSOR_INLINE_LIMIT`` bytes are their own store objects; smaller ones ride in the value's bundle.

Every other mutable object that two roots (names, or shared objects) hold keeps its identity too:
it becomes a shared object with a token and its own entry, updated in place on the standbys
(``kernel/shared_objects.py``; only the roots a cell touched are pickled to find them). A
matplotlib figure is one such object synced whole, a *unit*: objects inside it (axes, lines) are
referred to by their place in its pickle, so they keep their identity without tokens of their own.

The ``SyncUpdate`` record that goes through Raft is a restricted pickle of builtin containers only:
decoding it never imports a class or runs user code. User payloads are unpickled only in
``StateApplier.apply``, after their digest (BLAKE3; and, for store objects, the store's HMAC) has
been checked. See docs/state-sync.md.
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import ctypes
import functools
import gc
import hashlib
import importlib
import io
import logging
import pickle
import re
import struct
import sys
import threading
import time
import types
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import cloudpickle
import cloudpickle.cloudpickle as cloudpickle_internals

from notebookos.kernel import raw_tensor, rng_state
from notebookos.kernel.ast_effects import CellEffects
from notebookos.kernel.plain_pickle import PlainUnpickler as _PlainUnpickler
from notebookos.kernel.shared_objects import (
    Held,
    IdentityTable,
    fill_object,
    is_object_root,
    make_shell,
    object_root,
    reduction,
    release_unit,
    rewinding_reduce,
    rewinding_type,
    token_of_root,
    unit_types,
    untracked_type,
)
from notebookos.store.base import KeyNotFound, LargeObjectStore

log = logging.getLogger(__name__)

_Upload = bytes | memoryview | list[bytes | memoryview]  # a value, or its pieces in order

DEFAULT_THRESHOLD_BYTES = 1 << 20
TENSOR_INLINE_LIMIT = 64 * 1024  # serialised tensors above this are separate store objects
KINDS = ("inline", "pointer", "deleted", "module")
UPDATE_MAGIC = b"NBSYNC\x01"
CHECKPOINT_MAGIC = b"NBCKPT\x01"
CHECKPOINT_MANIFEST_MAGIC = b"NBCKPM\x01"
_PLAIN_PAYLOAD = b"P"  # payload = the cloudpickle bytes
_BUNDLE_PAYLOAD = b"B"  # payload = restricted pickle {"p": bytes, "t": {token: tensor bytes}}
# (a bundle's optional keys: "s" shared tokens, "m" how they are referred to, "u" unit refs)
_OBJECT_PAYLOAD = b"O"  # a shared object: restricted pickle {"s": shell pickle, "f": a P/B payload}
_TENSOR_PID = "nbos-tensor"

INTERNAL_NAMES = frozenset(
    {
        "In", "Out", "_", "__", "___", "_oh", "_ih", "_dh", "_i", "_ii", "_iii", "_exit_code",
        "get_ipython", "exit", "quit", "__builtins__", "__name__", "__doc__", "__spec__",
        "__loader__", "__package__", "__builtin__",
    }
)
_INTERNAL_PATTERN = re.compile(r"^(_i\d+|_\d+|_notebookos.*)$")


def is_internal_name(name: str) -> bool:
    """IPython's and the kernel's own names, never replicated."""
    return name in INTERNAL_NAMES or bool(_INTERNAL_PATTERN.match(name))


def object_key(kernel_id: str, digest: str) -> str:
    return f"{kernel_id}/objects/{digest}"


def checkpoint_key(kernel_id: str) -> str:
    return f"{kernel_id}/checkpoint"


DIGEST_PREFIX = "b3-"  # a content digest: "b3-" + BLAKE3-256 hex


# From this many bytes a digest is computed on every core (BLAKE3's tree hash: the same digest
# whatever the thread count). Below it, the threads' start costs more than they save.
PARALLEL_DIGEST_BYTES = 4 * 1024 * 1024


def _digest(*parts: bytes | memoryview) -> str:
    """The content digest of serialised bytes: ``b3-`` and their BLAKE3-256 in hex (a quarter
    of SHA-256's CPU a byte; every large object is hashed by its writer to name it). A large
    object is hashed on every core: after every cell the executor hashes every large array and
    tensor it holds (``StateEncoder._recheck``), so this is a cell's cost, not only a write's."""
    size = sum(len(part) if isinstance(part, bytes) else part.nbytes for part in parts)
    digest = (blake3.blake3(max_threads=blake3.blake3.AUTO) if size >= PARALLEL_DIGEST_BYTES
              else blake3.blake3())
    for part in parts:
        digest.update(part)
    return DIGEST_PREFIX + digest.hexdigest()


def _hash_of_digest(digest: str) -> tuple[Callable[..., Any], str]:
    """The hash constructor and prefix that made ``digest``: BLAKE3, or SHA-256 for a bare hex
    digest (what replicas wrote before 2026-11-26, still in older checkpoints and logs)."""
    if digest.startswith(DIGEST_PREFIX):
        return blake3.blake3, DIGEST_PREFIX
    return hashlib.sha256, ""


def _digest_of_key(store_key: str) -> str:
    return store_key.rsplit("/", 1)[-1]


# --------------------------------------------------------------------------------- records


@dataclass
class SyncEntry:
    """One name's new state. ``digest``: the serialised value's ``_digest`` (see docs)."""

    name: str
    kind: str  # "inline" | "pointer" | "deleted" | "module"
    digest: str
    payload: bytes | None = None  # inline
    store_key: str | None = None  # pointer
    size: int = 0
    module: str | None = None  # module: the module's import name
    tensors: dict[str, str] = field(default_factory=dict)  # token -> store key of a large tensor

    def to_plain(self) -> dict[str, Any]:
        return {
            "n": self.name, "k": self.kind, "d": self.digest, "p": self.payload,
            "s": self.store_key, "z": self.size, "m": self.module, "t": dict(self.tensors),
        }

    @classmethod
    def from_plain(cls, plain: Any) -> SyncEntry:
        if not isinstance(plain, dict):
            raise ValueError(f"sync entry must be a dict, not {type(plain).__name__}")
        try:
            entry = cls(
                name=plain["n"], kind=plain["k"], digest=plain["d"], payload=plain["p"],
                store_key=plain["s"], size=plain["z"], module=plain["m"], tensors=plain["t"],
            )
        except KeyError as exc:
            raise ValueError(f"sync entry lacks field {exc.args[0]!r}") from None
        entry.validate()
        return entry

    def validate(self) -> None:
        """Raise ValueError when the fields do not make a well-formed entry of its kind."""
        def bad(why: str) -> ValueError:
            return ValueError(f"malformed sync entry for {self.name!r}: {why}")

        if not isinstance(self.name, str) or not self.name:
            # Not necessarily an identifier: globals()["a-b"] = 1 is a legal namespace key.
            raise ValueError(f"malformed sync entry: name {self.name!r} is not a non-empty str")
        if self.kind not in KINDS:
            raise bad(f"unknown kind {self.kind!r}")
        if not isinstance(self.digest, str) or not isinstance(self.size, int):
            raise bad("digest must be a str and size an int")
        if not isinstance(self.tensors, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.tensors.items()
        ):
            raise bad("tensors must map str tokens to str store keys")
        if self.kind == "inline" and not isinstance(self.payload, bytes):
            raise bad("an inline entry needs a bytes payload")
        if self.kind == "pointer" and not isinstance(self.store_key, str):
            raise bad("a pointer entry needs a store key")
        if self.kind == "module" and not isinstance(self.module, str):
            raise bad("a module entry needs the module's name")


@dataclass
class SyncUpdate:
    """The state changes of one cell, as replicated through the Raft log."""

    entries: list[SyncEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # library modules the executor imported during the cell, for the standbys to import ahead
    # of a takeover (module_warmup.py); absent from records written before it existed
    modules: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        plain = {"v": 1, "e": [e.to_plain() for e in self.entries], "w": list(self.warnings)}
        if self.modules:
            plain["m"] = list(self.modules)
        return UPDATE_MAGIC + pickle.dumps(plain, protocol=5)

    @classmethod
    def from_bytes(cls, data: bytes) -> SyncUpdate:
        """Decode a record; raise ValueError (never run code) when it is malformed."""
        plain = _load_plain(data, UPDATE_MAGIC, "sync update")
        entries = plain.get("e")
        warnings = plain.get("w")
        if not isinstance(entries, list) or not isinstance(warnings, list):
            raise ValueError("malformed sync update: entries and warnings must be lists")
        if not all(isinstance(w, str) for w in warnings):
            raise ValueError("malformed sync update: warnings must be strings")
        return cls([SyncEntry.from_plain(e) for e in entries], warnings,
                   _module_names(plain, "sync update"))


def _module_names(plain: dict[str, Any], what: str) -> list[str]:
    modules = plain.get("m", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ValueError(f"malformed {what}: modules must be a list of strings")
    return modules


@dataclass
class Checkpoint:
    """The whole synced namespace of a kernel after ``execution_count`` cells."""

    entries: dict[str, SyncEntry]
    execution_count: int
    kernel_id: str
    modules: list[str] = field(default_factory=list)  # library modules the namespace came with
    epoch: int = 0  # the kernel's incarnation that wrote it (RestartKernel starts a new one)


def _load_plain(data: bytes, magic: bytes, what: str) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if not data.startswith(magic):
        raise ValueError(f"not a NotebookOS {what} (bad magic or unsupported version)")
    try:
        plain = _PlainUnpickler(io.BytesIO(data[len(magic):])).load()
    except Exception as exc:  # noqa: BLE001 - any decoding failure means a malformed record
        raise ValueError(f"malformed {what}: {exc}") from None
    if not isinstance(plain, dict) or plain.get("v") != 1:
        raise ValueError(f"malformed {what}: expected a version-1 dict")
    return plain


class SyncApplyError(Exception):
    """Some entries could not be applied; ``failures`` maps each variable name to the reason."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        details = "; ".join(f"{name}: {why}" for name, why in self.failures.items())
        super().__init__(f"could not apply {len(self.failures)} variable(s): {details}")


# ------------------------------------------------------------------------- tensor identity


def _torch() -> types.ModuleType | None:
    """torch if the user (or anything) already imported it; never imports it."""
    return sys.modules.get("torch")


def _tensor_fingerprint(tensor: Any) -> tuple | None:
    """Cheap evidence that a tensor is unchanged; None when torch cannot tell (inference mode)."""
    try:
        return (
            tensor._version, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()),
            tensor.storage_offset(), str(tensor.dtype), str(tensor.device),
            tensor.requires_grad, type(tensor),
        )
    except Exception:  # noqa: BLE001 - inference tensors, exotic subclasses
        return None


@dataclass
class _TensorRecord:
    token: str
    ref: weakref.ref
    fingerprint: tuple | None
    digest: str
    blob: bytes | None  # serialised bytes of a small tensor
    store_key: str | None  # store key of a large tensor
    content: bytes | str | None = None  # a small tensor's elements (``_content_of``)
    grad: str | None = None  # the token of a leaf tensor's ``.grad`` when it was recorded


class _WeakIdMap:
    """object -> token by identity, without keeping the object alive (tensors and arrays)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, str]] = {}

    def get(self, obj: Any) -> str | None:
        found = self._by_id.get(id(obj))
        return found[1] if found is not None and found[0]() is obj else None

    def set(self, obj: Any, token: str) -> None:
        key = id(obj)
        by_id = self._by_id

        def forget(ref: weakref.ref, key: int = key) -> None:
            current = by_id.get(key)
            if current is not None and current[0] is ref:
                del by_id[key]

        by_id[key] = (weakref.ref(obj, forget), token)


class SyncState:
    """What one replica knows about the synced namespace; shared by its encoder and applier.

    ``entries``: name -> the entry that produced the replica's current value (a new executor
    therefore resends nothing unchanged, and its checkpoints are complete). The tensor table maps
    tensor objects to tokens and back, so identity is kept across names and across updates.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.entries: dict[str, SyncEntry] = {}
        self.entry_tokens: dict[str, frozenset[str]] = {}  # name -> tensors/arrays its value holds
        self.dirty: set[str] = set()  # entries set or deleted since the last checkpoint segment
        # library modules imported here or by an executor (module_warmup.py), in import order;
        # those not yet in a checkpoint part
        self.modules: dict[str, None] = {}
        self.modules_dirty: list[str] = []
        self._records: dict[str, _TensorRecord] = {}
        self._tokens = _WeakIdMap()
        self._counter = 0
        self._token_prefix = uuid.uuid4().hex[:16]  # tokens must not collide across replicas
        # shared objects (reachable from two roots) and which root holds which object inline
        self.identity = IdentityTable(self._token_prefix)
        # the global random generators as this replica started (each counts once it is used)
        self.rng_at_start = rng_state.Baseline()

    def token_for(self, tensor: Any) -> str:
        token = self._tokens.get(tensor)
        if token is None:
            self._counter += 1
            token = f"{self._token_prefix}.{self._counter}"
            self._tokens.set(tensor, token)
        return token

    def peek(self, token: str) -> _TensorRecord | None:
        """The record, without taking the lock or pruning (safe from any thread)."""
        record = self._records.get(token)
        return record if record is not None and record.ref() is not None else None

    def record(self, token: str) -> _TensorRecord | None:
        record = self._records.get(token)
        if record is not None and record.ref() is None:
            del self._records[token]
            return None
        return record

    def remember(self, token: str, tensor: Any, digest: str, blob: bytes | None,
                 store_key: str | None) -> None:
        self._tokens.set(tensor, token)
        self._records[token] = _TensorRecord(
            token, weakref.ref(tensor), _fingerprint(tensor), digest, blob, store_key,
            _content_of(tensor) if blob is not None else None, self.grad_token(tensor),
        )

    def grad_token(self, tensor: Any) -> str | None:
        """The token of a leaf tensor's gradient (None without one, or for an array)."""
        grad = _grad_of(tensor)
        return None if grad is None else self.token_for(grad)

    def live_records(self) -> list[tuple[_TensorRecord, Any]]:
        """Every recorded tensor or array that still exists, with it."""
        found = []
        for record in list(self._records.values()):
            obj = record.ref()
            if obj is not None:
                found.append((record, obj))
        return found

    def forget_objects(self, store_keys: set[str]) -> None:
        """Forget tensors stored under these keys (their upload failed)."""
        for token in [t for t, r in self._records.items() if r.store_key in store_keys]:
            del self._records[token]

    def prune(self) -> None:
        """Forget tensors that no longer exist."""
        for token in [t for t, r in self._records.items() if r.ref() is None]:
            del self._records[token]


# ---------------------------------------------------------------------------- serialisation


# A tensor computed with autograd (``grad_fn`` set: a loss, an activation) travels as its
# values under this key; its graph, C++ nodes of the process that ran the forward pass, cannot.
GRAPH_LOST_KEY = "notebookos_autograd_graph_lost"
GRAPH_LOST_MESSAGE = (
    "NotebookOS: this tensor's autograd graph was lost when the replica that computed it failed "
    "(a graph cannot be replicated); run the cell that computes it (the forward pass) again, "
    "then call backward()")


def _serialise_tensor(tensor: Any) -> memoryview:
    """``torch.save`` bytes, as a view of the buffer (no copy of a large tensor's bytes)."""
    torch = _torch()
    assert torch is not None
    payload: Any = tensor
    if tensor.grad_fn is not None:
        payload = {GRAPH_LOST_KEY: tensor.detach()}
    elif tensor._base is not None:  # a view: save only its elements, not the whole base storage
        payload = tensor.detach().clone().requires_grad_(tensor.requires_grad)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getbuffer()


def _deserialise_tensor(blob: Any) -> Any:
    """A tensor from its blob: bytes, or a uint8 tensor holding them (``raw_tensor``)."""
    torch = _torch() or importlib.import_module("torch")
    if raw_tensor.is_raw(blob):
        return raw_tensor.load(torch, blob)
    # weights_only: the tensor loader cannot run code, whatever the bytes say.
    loaded = torch.load(io.BytesIO(raw_tensor.as_bytes(blob)), map_location="cpu",
                        weights_only=True)
    if isinstance(loaded, dict) and GRAPH_LOST_KEY in loaded:
        return _with_lost_graph(torch, loaded[GRAPH_LOST_KEY])
    return loaded


def _with_lost_graph(torch: Any, values: Any) -> Any:
    """``values`` as a tensor that requires grad and whose ``backward()`` says that its graph
    was lost, instead of a leaf that silently takes a gradient of ones for itself (a loss
    computed before a failover: its parameters' ``.grad`` stayed None, and training went on
    from wrong gradients without a word; the notebook corpus, llm-appendix-a cell 17)."""
    anchor = torch.zeros((), requires_grad=True)
    return _graph_lost_function(torch).apply(values, anchor)


@functools.cache
def _graph_lost_function(torch: Any) -> Any:
    class AutogradGraphLost(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, values: Any, anchor: Any) -> Any:  # noqa: ARG004
            return values.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:  # noqa: ARG004
            raise RuntimeError(GRAPH_LOST_MESSAGE)

    return AutogradGraphLost


def _serialise_array(array: Any) -> list[bytes | memoryview]:
    """``numpy.save``'s bytes (no pickle inside: object arrays are never extracted), in pieces:
    the header, then a view of a contiguous array's own memory, so that hashing and storing it
    make no copy (checked after every cell, see ``StateEncoder._recheck``)."""
    numpy = sys.modules["numpy"]
    header_of = _npy_header_writer()
    if header_of is not None and (array.flags.c_contiguous or array.flags.f_contiguous):
        try:
            body = memoryview(array if array.flags.c_contiguous else array.T).cast("B")
            head = io.BytesIO()
            header_of(head, numpy.lib.format.header_data_from_array_1_0(array), None)
            return [head.getvalue(), body]
        except (TypeError, ValueError):  # a dtype the buffer protocol cannot show (datetime64)
            pass
    buffer = io.BytesIO()
    numpy.save(buffer, array, allow_pickle=False)
    return [buffer.getbuffer()]


def _npy_header_writer() -> Callable[..., None] | None:
    """numpy.save's own header writer (private: found where this numpy keeps it, else None)."""
    for where in ("numpy.lib._format_impl", "numpy.lib.format"):
        module = sys.modules.get(where)
        writer = getattr(module, "_write_array_header", None)
        if writer is not None:
            return writer
    return None


def _deserialise_array(blob: Any) -> Any:
    numpy = sys.modules.get("numpy") or importlib.import_module("numpy")
    return raw_tensor.load_array(numpy, blob)


def _is_torch_tensor(obj: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _serialise_extracted(obj: Any) -> list[bytes | memoryview]:
    """The serialised pieces of a tensor or array (joined, they are its blob)."""
    if _is_torch_tensor(obj):
        parts = raw_tensor.parts(_torch(), obj, TENSOR_INLINE_LIMIT)
        return parts if parts is not None else [_serialise_tensor(obj)]
    return _serialise_array(obj)


def _fingerprint(obj: Any) -> tuple | None:
    # numpy has no version counter: an array is serialised and hashed whenever it is named.
    return _tensor_fingerprint(obj) if _is_torch_tensor(obj) else None


def _content_of(obj: Any) -> bytes | str | None:
    """A small tensor's element bytes (a copy: at most ``TENSOR_INLINE_LIMIT``), or their digest
    where they are not one plain block of CPU memory: what says, after a cell, that it changed
    though its version counter did not (``W.data += 1``, a write through ``.numpy()``). Its
    dtype and shape are in its fingerprint. None for anything else (large tensors and arrays
    are checked against the digest of their stored bytes, which are views of their memory)."""
    torch = _torch()
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    try:
        if (obj.device.type == "cpu" and obj.layout == torch.strided and obj.is_contiguous()
                and not obj.is_conj() and not obj.is_neg() and not obj.is_quantized):
            nbytes = obj.nbytes
            return ctypes.string_at(obj.data_ptr(), nbytes) if nbytes else b""
        data = obj.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.resolve_conj().resolve_neg().contiguous()
        return _digest(raw_tensor.memory_of(data))
    except Exception:  # noqa: BLE001 - sparse, quantized, subclasses: their serialised bytes
        return _digest(*_serialise_extracted(obj))


def _grad_of(obj: Any) -> Any:
    """A leaf tensor's ``.grad`` (None for anything else: a non-leaf's is never kept)."""
    if not _is_torch_tensor(obj) or not obj.is_leaf or not obj.requires_grad:
        return None
    return obj.grad


def _tensor_ref(token: str) -> Any:
    """Stands for a tensor in a pickled value; resolved by ``_ValueUnpickler``."""
    raise pickle.UnpicklingError(f"tensor {token} referenced outside a NotebookOS state update")


def _cached_function(func: Any, maxsize: int | None, typed: bool,
                     entries: list[tuple[Any, Any]] | None = None) -> Any:
    """A notebook function under ``functools.lru_cache`` / ``functools.cache``, wrapped again,
    its cache filled with ``entries`` (an unbounded cache's, as the executor held them)."""
    wrapper = functools.lru_cache(maxsize=maxsize, typed=typed)(func)
    if entries:
        cache = _unbounded_cache_of(wrapper)
        if cache is not None:
            cache.update(entries)
    return wrapper


# Cache contents travel with a cached function up to this many entries (beyond it the standby's
# cache starts empty, as after a restart).
CACHE_ENTRIES_CARRIED = 100_000


def _unbounded_cache_of(wrapper: Any) -> dict | None:
    """The dict an unbounded ``functools`` cache (``@cache``, ``lru_cache(maxsize=None)``) keeps
    its results in: the C wrapper exposes it to the garbage collector (``gc.get_referents``),
    not to Python. Writing into it fills the cache, as calls would. None for a bounded cache
    (its entries are list links) or where the dict cannot be told apart."""
    if wrapper.cache_parameters()["maxsize"] is not None:
        return None
    own = getattr(wrapper, "__dict__", None)
    found = [r for r in gc.get_referents(wrapper) if type(r) is dict and r is not own]
    if len(found) != 1 or len(found[0]) != wrapper.cache_info().currsize:
        return None
    return found[0]


def _kwd_mark_of_this_process() -> Any:
    """The separator ``functools``' C cache puts between positional and keyword arguments in a
    key (``lru_cache_make_key``): an object of each process, found from a key it made."""
    @functools.cache
    def probe(*args: Any, **kwargs: Any) -> None:
        return None

    probe(k=1)
    cache = _unbounded_cache_of(probe)
    key = next(iter(cache)) if cache else None
    return key[0] if isinstance(key, tuple) and len(key) == 3 else None


_KWD_MARK = _kwd_mark_of_this_process()


def _kwd_mark() -> Any:
    """Stands for the executor's keyword separator in a pickled cache key: this process's."""
    return _KWD_MARK


def _tensor_with_grad_ref(token: str, grad: Any) -> Any:
    """Stands for a leaf tensor and its ``.grad`` in a pickled value; see ``_tensor_ref``."""
    raise pickle.UnpicklingError(f"tensor {token} referenced outside a NotebookOS state update")


def _array_ref(token: str) -> Any:
    """Stands for a large numpy array in a pickled value; resolved by ``_ValueUnpickler``."""
    raise pickle.UnpicklingError(f"array {token} referenced outside a NotebookOS state update")


def _namespace_ref() -> dict[str, Any]:
    """Stands for the notebook namespace (a function's globals); resolved by ``_ValueUnpickler``."""
    return {}


class _NamespaceRef:
    def __reduce__(self) -> tuple[Any, tuple]:
        return (_namespace_ref, ())


_NAMESPACE = _NamespaceRef()


def _unit_ref(ref: str) -> Any:
    """In a pickle, a unit or an object inside one (``IdentityTable.unit_ref``); the replica's
    unpickler resolves it."""
    raise pickle.UnpicklingError(f"unit reference {ref!r} outside a NotebookOS unpickler")


class _NewUnit(Exception):  # noqa: N818 - a signal, not an error
    """A root's pickle reached a unit that has no token yet: it is shared and synced first, and
    the root is pickled again after it (then referring to it and to the objects inside it)."""

    def __init__(self, obj: Any) -> None:
        super().__init__(type(obj).__name__)
        self.obj = obj


class _UnitRefs:
    """What one root's pickler refers to through units (see ``IdentityTable.unit_ref``)."""

    def __init__(self, identity: IdentityTable, root: str, kinds: tuple[type, ...]) -> None:
        self._identity = identity
        self._root = root
        self._kinds = kinds
        # read-only while one root is pickled (called once per pickled object: kept cheap)
        self._interior = identity.interior_by_id()
        self._tokens = identity.token_by_id()
        self.rewind_type = rewinding_type()
        self.used: dict[str, None] = {}  # refs, in order of first use
        self.ids: set[int] = set()  # the objects referred to (not held inline by this root)

    def ref(self, obj: Any) -> str | None:
        key = id(obj)
        owner = self._interior.get(key)
        if owner is None and key not in self._tokens:
            if self._kinds and isinstance(obj, self._kinds):
                raise _NewUnit(obj)
            return None
        if owner == self._root or type(obj) is types.FunctionType:
            return None  # its own, by reference (``_unit_ref`` itself), or a notebook function
        found = self._identity.unit_ref(obj, self._root, _untracked)
        if found is not None:
            self.used[found] = None
            self.ids.add(id(obj))
        return found

    def tokens(self) -> set[str]:
        return {ref.partition("#")[0] for ref in self.used}


def _namespace_function_setstate(func: types.FunctionType, state: Any) -> None:
    """cloudpickle's function setstate, minus its overwrite of the namespace's ``__builtins__``."""
    namespace = func.__globals__
    had_builtins = "__builtins__" in namespace
    builtins = namespace.get("__builtins__")
    cloudpickle_internals._function_setstate(func, state)
    if had_builtins:
        namespace["__builtins__"] = builtins


class _ValuePickler(cloudpickle.CloudPickler):
    """cloudpickle, with two changes (see the module docstring and docs/state-sync.md):

    - every torch tensor, and every plain numpy array over ``TENSOR_INLINE_LIMIT`` bytes, becomes
      a token (``on_tensor``) and is serialised on its own;
    - a notebook function (its globals are the namespace) is pickled without the values of the
      globals it uses, and is rebound to the standby's namespace: it keeps seeing live globals.
    """

    def __init__(
        self, file: io.BytesIO, namespace: Any, on_tensor: Callable[[Any], str] | None,
        units: _UnitRefs | None = None, view_roots: Mapping[int, Any] | None = None,
    ) -> None:
        super().__init__(file, protocol=5)
        self._namespace = namespace
        self._on_tensor = on_tensor
        self._units = units
        # arrays whose memory several names' arrays share (``x2_sub = x2[:2, :2]``), by id:
        # each goes by its token, and every view of it as a view (``_array_view``)
        self._view_roots = view_roots if on_tensor is not None else None
        torch = _torch()
        numpy = sys.modules.get("numpy")
        self._tensor_type = torch.Tensor if (torch is not None and on_tensor) else None
        self._array_type = numpy.ndarray if (numpy is not None and on_tensor) else None
        self.class_members: set[int] = set()  # ids never tracked for sharing (see below)

    def reducer_override(self, obj: Any) -> Any:
        if self._units is not None:  # matplotlib is loaded, or was
            ref = self._units.ref(obj)
            if ref is not None:
                return (_unit_ref, (ref,))
            if type(obj) is self._units.rewind_type:
                return rewinding_reduce(obj)
        if isinstance(obj, type) and not cloudpickle_internals._should_pickle_by_reference(obj):
            self._skip_class_members(obj)
        if self._tensor_type is not None and isinstance(obj, self._tensor_type):
            root = self._view_roots.get(id(obj)) if self._view_roots else None
            if root is not None:  # a tensor over a numpy array's memory (torch.from_numpy)
                return (_tensor_over_array, _view_arguments(obj.numpy(), root))
            token = self._on_tensor(obj)  # type: ignore[misc]
            if obj.is_leaf and obj.requires_grad:
                # its gradient is part of its state (``W.grad`` after ``backward()``)
                return (_tensor_with_grad_ref, (token, obj.grad))
            return (_tensor_ref, (token,))
        if self._view_roots and type(obj) is self._array_type:
            root = _array_root(obj)
            if id(root) in self._view_roots:
                if root is obj:
                    return (_array_ref, (self._on_tensor(obj),))  # type: ignore[misc]
                return (_array_view, _view_arguments(obj, root))
        if (type(obj) is self._array_type and obj.nbytes > TENSOR_INLINE_LIMIT
                and not obj.dtype.hasobject):
            return (_array_ref, (self._on_tensor(obj),))  # type: ignore[misc]
        if type(obj) is functools._lru_cache_wrapper:  # noqa: SLF001 - @functools.cache
            wrapped = getattr(obj, "__wrapped__", None)
            if (isinstance(wrapped, types.FunctionType)
                    and wrapped.__globals__ is self._namespace):
                # a notebook function under @cache / @lru_cache: pickling by reference looked it
                # up in __main__, where a standby has no such name; the function travels by
                # value and is wrapped again, its cache with it when unbounded (a recursive
                # function whose cache the executor's cells filled would otherwise recurse from
                # scratch on a new executor: RecursionError, found by the notebook corpus)
                parameters = obj.cache_parameters()
                cache = _unbounded_cache_of(obj)
                entries = (list(cache.items()) if cache is not None
                           and len(cache) <= CACHE_ENTRIES_CARRIED else None)
                return (_cached_function, (wrapped, parameters["maxsize"], parameters["typed"],
                                           entries))
        if obj is _KWD_MARK and obj is not None:
            return (_kwd_mark, ())
        if (isinstance(obj, type) and "__slotnames__" not in obj.__dict__
                and not cloudpickle_internals._should_pickle_by_reference(obj)):
            # Pickling an instance caches __slotnames__ on its class; do it now so that a
            # notebook class serialises the same before and after its first instance is synced.
            copyreg._slotnames(obj)
        return super().reducer_override(obj)

    def _skip_class_members(self, cls: type) -> None:
        """A notebook class travels by value inside every value that holds an instance: its
        methods and dunders are not tracked (the class keeps its identity through cloudpickle's
        class tracker, and they would look shared by every such value). Its data attributes are
        (``class K: items = []`` then ``alias = K.items``)."""
        for key, member in vars(cls).items():
            for inner in ("__func__", "fget", "fset", "fdel"):
                wrapped = getattr(member, inner, None)
                if wrapped is not None:
                    self.class_members.add(id(member))
                    member = wrapped
            if isinstance(member, types.FunctionType):
                for part in (member, member.__dict__, member.__defaults__,
                             member.__kwdefaults__, member.__annotations__):
                    self.class_members.add(id(part))
            elif key.startswith("__") and key.endswith("__"):
                self.class_members.add(id(member))

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        if func.__globals__ is not self._namespace:
            return super()._dynamic_function_reduce(func)
        code = func.__code__
        closure = None
        if func.__closure__ is not None:
            closure = tuple(cloudpickle_internals._make_empty_cell() for _ in code.co_freevars)
        state, slotstate = cloudpickle_internals._function_getstate(func)
        slotstate["__globals__"] = {}  # the standby's namespace provides the globals
        return (
            types.FunctionType, (code, _NAMESPACE, None, None, closure), (state, slotstate),
            None, None, _namespace_function_setstate,
        )


class _SharedRefPickler(_ValuePickler):
    """The slow way to refer to shared objects (a Python call per pickled object): as persistent
    ids, numbered in order of first use. Used when pickling a value *with* its shared objects'
    contents fails (a shared dict now holds a lock): the value itself may still be fine."""

    def __init__(
        self, file: io.BytesIO, namespace: Any, on_tensor: Callable[[Any], str] | None,
        token_by_id: Mapping[int, str], units: _UnitRefs | None = None,
        view_roots: Mapping[int, Any] | None = None,
    ) -> None:
        super().__init__(file, namespace, on_tensor, units, view_roots)
        self._token_by_id = token_by_id
        self.order: list[str] = []
        self._index: dict[str, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        token = self._token_by_id.get(id(obj))
        if token is None or (self._units is not None and self._units.ref(obj) is not None):
            return None
        index = self._index.get(token)
        if index is None:
            index = self._index[token] = len(self.order)
            self.order.append(token)
        return index


def _untracked(kind: type) -> bool:
    """Never shared through the identity table: immutable values, classes, and tensors and numpy
    arrays (large ones have their own table, small arrays are copied per name)."""
    if untracked_type(kind) or kind is _NamespaceRef:
        return True
    torch = _torch()
    if torch is not None and issubclass(kind, torch.Tensor):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and issubclass(kind, numpy.ndarray | numpy.generic | numpy.dtype)


class _ValueUnpickler(pickle.Unpickler):
    def __init__(
        self, data: bytes, namespace: Any, resolve: Callable[[str, str], Any],
        shared: list[Any] | None = None, by_pid: bool = False,
        units: Callable[[str], Any] | None = None,
    ) -> None:
        self._shared = list(shared or ())
        self._by_pid = by_pid
        self._units = units
        self._unit_ids: set[int] = set()
        # The pickler was given the shared objects in its memo (indices 0, 1, ...); a prologue
        # puts them at the same indices here (Unpickler.memo cannot be preset in CPython 3.11).
        # With ``by_pid`` the pickle refers to them by persistent id instead.
        prologue = b"".join(
            pickle.BININT + struct.pack("<i", index) + pickle.BINPERSID + pickle.MEMOIZE
            + pickle.POP for index in range(0 if by_pid else len(self._shared))
        )
        super().__init__(io.BytesIO(prologue + data if prologue else data))
        self._namespace = namespace if isinstance(namespace, dict) else {}
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is int and 0 <= pid < len(self._shared):
            return self._shared[pid]
        raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")

    def held(self) -> Held:
        """The objects this load created, as ``IdentityTable.register`` takes them."""
        memo = self.memo.copy()  # index -> object
        held = dict(zip(map(id, memo.values()), memo.items(), strict=True))
        if not self._by_pid:
            for obj in self._shared:
                held.pop(id(obj), None)
        for key in self._unit_ids:
            held.pop(key, None)
        return held

    def _tensor_with_grad(self, token: str, grad: Any) -> Any:
        tensor = _set_grad(self._resolve(token, "torch"), grad)
        noted = getattr(self._resolve, "grad_set", None)
        if noted is not None:
            noted(token, tensor)
        return tensor

    def _resolve_unit(self, ref: str) -> Any:
        if self._units is None:
            raise pickle.UnpicklingError(f"unexpected unit reference {ref!r}")
        obj = self._units(ref)
        self._unit_ids.add(id(obj))
        return obj

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__:
            if name == "_tensor_ref":
                return lambda token: self._resolve(token, "torch")
            if name == "_tensor_with_grad_ref":
                return self._tensor_with_grad
            if name == "_array_ref":
                return lambda token: self._resolve(token, "numpy")
            if name == "_namespace_ref":
                return lambda: self._namespace
            if name == "_unit_ref":
                return self._resolve_unit
        return super().find_class(module, name)


def _pack(
    skeleton: bytes, small_tensors: Mapping[str, bytes], shared: list[str], by_pid: bool = False,
    units: list[str] | None = None,
) -> bytes:
    """The payload: the pickle, its small tensors, the tokens of the shared objects it refers
    to (memo indices 0, 1, ... of the pickle in this order, or, ``by_pid``, persistent ids), and
    the unit references it makes (the only ones its unpickler resolves)."""
    if not small_tensors and not shared and not units:
        return _PLAIN_PAYLOAD + skeleton
    plain: dict[str, Any] = {"p": skeleton, "t": dict(small_tensors)}
    if shared:
        plain["s"] = list(shared)
    if by_pid:
        plain["m"] = "pid"
    if units:
        plain["u"] = list(units)
    return _BUNDLE_PAYLOAD + pickle.dumps(plain, protocol=5)


def _unpack(payload: bytes) -> tuple[bytes, dict[str, bytes], list[str], bool, list[str]]:
    """(pickle, small tensors, shared tokens, whether they are persistent ids, unit refs)."""
    if payload[:1] == _PLAIN_PAYLOAD:
        return payload[1:], {}, [], False, []
    if payload[:1] == _BUNDLE_PAYLOAD:
        plain = _PlainUnpickler(io.BytesIO(payload[1:])).load()
        shared = plain.get("s", []) if isinstance(plain, dict) else None
        units = plain.get("u", []) if isinstance(plain, dict) else None
        if (isinstance(plain, dict) and isinstance(plain.get("p"), bytes)
                and isinstance(plain.get("t"), dict) and isinstance(shared, list)
                and all(isinstance(token, str) for token in shared)
                and isinstance(units, list) and all(isinstance(ref, str) for ref in units)
                and plain.get("m") in (None, "pid")):
            return plain["p"], plain["t"], shared, plain.get("m") == "pid", units
    raise ValueError("payload is not a NotebookOS value bundle")


def _entry_digest(payload: bytes, tensors: Mapping[str, str], like: str = DIGEST_PREFIX) -> str:
    """The digest of the payload followed by the digests of its separately stored tensors,
    made the way ``like`` was (``_hash_of_digest``): a check of an earlier replica's entry
    recomputes it with SHA-256. Without tensors it is the payload's own ``_digest``."""
    hasher, prefix = _hash_of_digest(like)
    digest = hasher(payload)
    for token in sorted(tensors):
        digest.update(f"\0{token}={_digest_of_key(tensors[token])}".encode())
    return prefix + digest.hexdigest()


def _forced_pointer(value: Any) -> bool:
    """Tensors, modules, optimizers and numpy arrays always go to the store."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return True
    torch = _torch()
    if torch is None:
        return False
    return isinstance(value, torch.Tensor | torch.nn.Module | torch.optim.Optimizer)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Any:
    """Pause the cyclic garbage collector while a value graph is pickled or unpickled.

    Each allocation-triggered collection walks the objects alive, so pickling or loading a graph
    of N objects next to others of that size costs about N^2: a 64-axes figure (~100,000 objects)
    took 1.5 s to encode and apply with the collector running, 0.5 s with it paused (docs/
    state-sync.md, "Units"). Reference counting still frees everything acyclic; cycles wait for
    the next collection. Left as found when the collector was already off (or a nested pause)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _importable_module_name(module: types.ModuleType) -> str | None:
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or name == "__main__" or getattr(module, "__spec__", 1) is None:
        return None
    return name if sys.modules.get(name) is module else None


# ---------------------------------------------------------------------------------- encoder


class StateEncoder:
    """Turns the names a cell changed into a ``SyncUpdate``; puts large values in the store."""

    def __init__(
        self,
        store: LargeObjectStore,
        kernel_id: str,
        threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        *,
        state: SyncState | None = None,
        upload_threads: int = 4,
    ) -> None:
        if threshold_bytes < 0:
            raise ValueError(f"threshold_bytes must be >= 0, not {threshold_bytes}")
        self.store = store
        self.kernel_id = kernel_id
        self.threshold_bytes = threshold_bytes
        self.state = state or SyncState()
        self._known_objects: set[str] = set()  # store keys known to exist
        # tokens whose bytes this encode has hashed already: a large array the cell names is
        # checked once, not once by ``_recheck`` and again when its name is pickled
        self._hashed_in_encode: set[str] = set()
        self._upload_threads = upload_threads
        self._view_roots: dict[int, Any] = {}  # this encode's (see ``_shared_array_memory``)

    def holds_tensors(self) -> bool:
        """Whether the synced namespace holds tensors or large arrays (each cell checks them)."""
        return bool(self.state.live_records())

    def snapshot_entries(self) -> dict[str, SyncEntry]:
        """Current name -> entry of the synced namespace (for checkpoints)."""
        with self.state.lock:
            return dict(self.state.entries)

    def candidate_names(self, namespace: Mapping[str, Any], effects: CellEffects) -> list[str]:
        """The names to check: those the cell may have changed, plus what called functions use."""
        if effects.rescan:
            names = set(namespace) | {n for n in self.state.entries
                                      if not is_object_root(n) and not rng_state.is_rng_root(n)}
        else:
            names = set(effects.bound | effects.deleted | effects.mutated)
            # Functions passed as arguments (map(step, xs)) may be called too.
            names |= _names_reached_by_calls(namespace, effects.called | effects.mutated)
            names |= _arrays_sharing_memory(namespace, effects.mutated)
        return sorted(n for n in names if not is_internal_name(n))

    def encode(self, namespace: Mapping[str, Any], effects: CellEffects) -> SyncUpdate:
        """Entries for every candidate name whose value changed, was deleted or became unsyncable.

        Shared objects the candidates reach are checked too (each is its own entry, see
        kernel/shared_objects.py); names the cell did not touch are not looked at, unless one of
        them holds an object that a touched name now shares (it is then pickled once more, with
        the object's token in place of the object).

        Never raises for a bad value: an unserialisable one yields a warning naming it instead.
        Raises ``StoreError`` when large objects cannot be stored; nothing is then recorded as
        synced, so the next encode sends those names again.
        """
        update = SyncUpdate()
        uploads: dict[str, _Upload] = {}
        changed_tokens: set[str] = set()  # tensors/arrays whose bytes changed in this encode
        tokens_of: dict[str, frozenset[str]] = {}
        entries: dict[str, SyncEntry] = {}  # root -> its new entry (absent: unchanged)
        with self.state.lock, _cyclic_gc_paused():
            self._hashed_in_encode = set()
            self._recheck(uploads, changed_tokens)
            # Three queues, taken in this order: the names to check (and entries to refresh);
            # roots holding an object that has just become shared (until pickled again they still
            # count as its owner, so they go before shared objects; once each, however many of
            # their objects became shared); the shared objects the checked roots reach.
            # A unit met for the first time (a matplotlib figure) goes before all of them: the
            # roots that reach it are pickled after it, referring to the objects inside it.
            todo = collections.deque(self.candidate_names(namespace, effects))
            self._view_roots, members = _shared_array_memory(namespace)
            if members:
                # names whose arrays share memory and whose entries do not refer to the shared
                # array's token yet (they were copies): sent again, as views of it
                queued = set(todo)
                for name, root in members.items():
                    token = self.state.token_for(root)
                    if name not in queued and token not in self.state.entry_tokens.get(
                            name, frozenset()):
                        todo.append(name)
            units: dict[str, None] = {}
            redo: dict[str, None] = {}
            objects: dict[str, None] = {}
            done: set[str] = set()
            identity = self.state.identity
            while True:
                while todo or units or redo or objects:
                    if units:
                        root = next(iter(units))
                        del units[root]
                    elif todo:
                        root = todo.popleft()
                    elif redo:
                        root = next(iter(redo))
                        del redo[root]
                    else:
                        root = next(iter(objects))
                        del objects[root]
                        if root in done:
                            continue
                    done.add(root)
                    follow, owners, new_units = self._encode_root(
                        root, namespace, entries, update, uploads, changed_tokens, tokens_of)
                    units.update(dict.fromkeys(new_units))
                    redo.update(dict.fromkeys(owners))
                    objects.update(dict.fromkeys(follow - done))
                    if identity.is_unit_root(root):
                        # Refs to the objects inside a unit name its memo indices and version:
                        # the roots holding them are pickled again when it changed, or when they
                        # were pickled before it in this encode.
                        changed = root in entries
                        redo.update(dict.fromkeys(
                            r for r in identity.referrers(token_of_root(root))
                            if r != root and (changed or r in done)))
                # An entry synced earlier that holds a tensor whose bytes just changed (opt.step()
                # changes model's parameters) is stale: refresh it, so that every entry names the
                # current bytes of each tensor (checkpoints and snapshots then restore consistently).
                todo.extend(sorted(
                    name for name, tokens in self.state.entry_tokens.items()
                    if name not in done and self._root_exists(name, namespace)
                    and tokens & changed_tokens
                ) if changed_tokens else ())
                if not todo:
                    break
            self._drop_orphans(entries)
            self._encode_rng(entries)
            update.entries = list(entries.values())
            try:
                self._upload(uploads)
            except Exception:
                # Tensors whose bytes did not reach the store must be serialised again next time.
                self.state.forget_objects(set(uploads) - self._known_objects)
                raise
            for entry in update.entries:
                self.state.dirty.add(entry.name)
                if entry.kind == "deleted":
                    self.state.entries.pop(entry.name, None)
                    self.state.entry_tokens.pop(entry.name, None)
                else:
                    self.state.entries[entry.name] = entry
            self.state.entry_tokens.update(tokens_of)
            self.state.prune()
        return update

    def _encode_rng(self, entries: dict[str, SyncEntry]) -> None:
        """The global random generators' states, when a cell changed them (kernel/rng_state.py):
        they differ from what this replica last sent or applied, or, before that, from this
        replica's own at its start (a notebook that never draws a number never sends them)."""
        try:
            captured = rng_state.capture()
        except Exception as exc:  # noqa: BLE001 - never fail a cell's sync for it
            log.warning("could not capture the random generators' states: %s", exc)
            return
        previous = self.state.entries.get(rng_state.RNG_ROOT)
        if previous is None and self.state.rng_at_start.unchanged(captured):
            return
        payload = _PLAIN_PAYLOAD + rng_state.to_bytes(captured)
        digest = _digest(payload)
        if previous is None or previous.digest != digest:
            entries[rng_state.RNG_ROOT] = SyncEntry(rng_state.RNG_ROOT, "inline", digest,
                                                    payload=payload, size=len(payload))

    def _root_exists(self, root: str, namespace: Mapping[str, Any]) -> bool:
        if is_object_root(root):
            return token_of_root(root) in self.state.identity.shared
        return root in namespace

    def _drop_orphans(self, entries: dict[str, SyncEntry]) -> None:
        """Delete the shared objects that no root references any more (and, in turn, those
        only they referenced)."""
        identity = self.state.identity
        while orphans := identity.take_orphans():
            for token in orphans:
                root = object_root(token)
                identity.drop(token)
                self.state.entry_tokens.pop(root, None)
                if root in self.state.entries:
                    entries[root] = SyncEntry(root, "deleted", "")
                else:
                    entries.pop(root, None)

    def _encode_root(
        self, root: str, namespace: Mapping[str, Any], entries: dict[str, SyncEntry],
        update: SyncUpdate, uploads: dict[str, _Upload], changed_tokens: set[str],
        tokens_of: dict[str, frozenset[str]],
    ) -> tuple[set[str], set[str], set[str]]:
        """Encode one name or shared object; return (object roots to check next, roots to encode
        again because an object they hold has just become shared, units met for the first time:
        to encode before anything else, this root being encoded again after them).

        The shared objects to check are those the root references now *and* those it referenced
        before: ``b.append(1); b = []`` changed the list that another name still holds.
        """
        identity = self.state.identity
        previous = self.state.entries.get(root)
        before = {object_root(token) for token in identity.refs.get(root, ())}
        if not self._root_exists(root, namespace):
            identity.unregister(root)
            if previous is not None:
                entries[root] = SyncEntry(root, "deleted", "")
            else:
                entries.pop(root, None)
            return before, set(), set()
        tokens: set[str] = set()
        redo: set[str] = set()
        try:
            while True:
                tokens.clear()
                entry, held, refs = self._encode_value(
                    root, namespace, uploads, changed_tokens, tokens)
                owners, again = self._share_new(root, held, namespace)
                redo |= owners
                if not again:
                    break  # else pickle this root again, with the new tokens
        except _NewUnit as new:
            unit = object_root(identity.share(new.obj))
            return before | {unit}, redo | {root}, {unit}
        except Exception as exc:  # noqa: BLE001 - user values fail in any way
            if is_object_root(root):
                # Names still hold it: standbys keep its last contents (and its identity), and
                # the next cell that reaches it tries again.
                holders = sorted(n for n in identity.referrers(token_of_root(root))
                                 if not is_object_root(n))
                update.warnings.append(_unsyncable_warning(
                    f"the object shared by {', '.join(holders) or 'other objects'}", exc))
                entries.pop(root, None)
                return before, redo, set()
            identity.unregister(root)
            update.warnings.append(_unsyncable_warning(f"variable {root!r}", exc))
            if previous is not None:  # standbys must not keep a stale value
                entries[root] = SyncEntry(root, "deleted", "")
            else:
                entries.pop(root, None)
            return before, redo, set()
        identity.register(root, held, refs, entry.digest)
        tokens_of[root] = frozenset(tokens)
        if previous is None or previous.digest != entry.digest or previous.kind != entry.kind:
            entries[root] = entry
        else:
            entries.pop(root, None)
        return before | {object_root(token) for token in refs}, redo, set()

    def _share_new(
        self, root: str, held: Held, namespace: Mapping[str, Any]
    ) -> tuple[set[str], bool]:
        """Give a token to each outermost object ``root`` holds inline that another root holds
        too; return (those other roots: they must be pickled again, whether ``root`` must be).

        Only the outermost: ``alias = big`` shares ``big``, not each object inside it (those stay
        inline in ``big``'s own entry). An object reachable from one shared in this pass waits
        for the next pass (the root is pickled again and only what is still inline and held
        elsewhere is considered). Nothing inside a unit is shared: the other roots are pickled
        again, referring to those objects inside the unit.
        """
        identity = self.state.identity
        if identity.is_unit_root(root):
            return {owner for _, _, owner in identity.held_elsewhere(root, held, _untracked)
                    if owner != root}, False
        owners: set[str] = set()
        reducer = None
        below = None
        for _index, obj, owner in identity.held_elsewhere(root, held, _untracked):
            if below is None:
                below = _Reach(namespace, identity.token_by_id())
                reducer = _ValuePickler(io.BytesIO(), namespace, None).reducer_override
            elif below.reaches(obj):
                continue
            if identity.is_unit_root(owner):
                continue  # not referred to as inside it (an untracked kind): a copy
            if reduction(obj, reducer) is None:  # type: ignore[arg-type]
                continue  # cannot be updated in place: each root keeps its own copy
            identity.share(obj)
            below.add(obj)
            owners.add(owner)
        return owners, bool(owners)

    # ---- one value

    def _encode_value(
        self, root: str, namespace: Mapping[str, Any], uploads: dict[str, _Upload],
        changed_tokens: set[str], tokens: set[str],
    ) -> tuple[SyncEntry, Held, set[str]]:
        """The root's entry, the objects its payload holds inline, and the tokens it references."""
        if is_object_root(root):
            return self._encode_object(root, namespace, uploads, changed_tokens, tokens)
        value = namespace[root]
        if isinstance(value, types.ModuleType):
            module = _importable_module_name(value)
            if module is None:
                raise TypeError(f"module {getattr(value, '__name__', '?')!r} is not importable")
            return (SyncEntry(root, "module", _digest(b"module:", module.encode()), module=module),
                    {}, set())
        payload, large, held, refs = self._pickle(root, value, namespace, uploads,
                                                  changed_tokens, tokens)
        return self._entry(root, value, payload, large, uploads), held, refs

    def _encode_object(
        self, root: str, namespace: Mapping[str, Any], uploads: dict[str, _Upload],
        changed_tokens: set[str], tokens: set[str],
    ) -> tuple[SyncEntry, Held, set[str]]:
        obj = self.state.identity.shared[token_of_root(root)]
        found = reduction(obj, _ValuePickler(io.BytesIO(), namespace, None).reducer_override)
        if found is None:
            raise TypeError(f"shared {type(obj).__name__} object can no longer be reduced")
        shell, fill = found
        shell_buffer = io.BytesIO()
        _ValuePickler(shell_buffer, namespace, None).dump(shell)
        fill_payload, large, held, refs = self._pickle(root, fill, namespace, uploads,
                                                       changed_tokens, tokens)
        payload = _OBJECT_PAYLOAD + pickle.dumps(
            {"s": shell_buffer.getvalue(), "f": fill_payload}, protocol=5)
        return self._entry(root, obj, payload, large, uploads), held, refs

    def _pickle(
        self, root: str, value: Any, namespace: Mapping[str, Any], uploads: dict[str, _Upload],
        changed_tokens: set[str], tokens: set[str],
    ) -> tuple[bytes, dict[str, str], Held, set[str]]:
        """Pickle ``value``: (payload, large tensors, objects held inline, shared tokens used).

        At C speed, twice when ``value`` reaches shared objects: the first pickle's memo says which
        ones; the second is given them in its memo up front, so it refers to each by memo index
        (their tokens go in the payload, in that order) instead of pickling it again. Units, and
        objects inside another root's unit, are referred to as they are met (``_UnitRefs``).
        """
        identity = self.state.identity
        token_by_id = identity.token_by_id()
        kinds = unit_types()
        units = _UnitRefs(identity, root, kinds) if kinds or identity.units else None
        small: dict[str, bytes] = {}
        large: dict[str, str] = {}

        def on_tensor(tensor: Any) -> str:
            token, record = self._tensor(tensor, uploads, changed_tokens)
            tokens.add(token)
            if record.blob is not None:
                small[token] = record.blob
            else:
                large[token] = record.store_key  # type: ignore[assignment]
            return token

        def dump(shared: list[tuple[str, Any]]) -> tuple[bytes, Held, set[int]]:
            small.clear()
            large.clear()
            if units is not None:
                units.used.clear()
                units.ids.clear()
            buffer = io.BytesIO()
            pickler = _ValuePickler(buffer, namespace, on_tensor, units, self._view_roots)
            if shared:
                pickler.memo = {id(obj): (index, obj) for index, (_, obj) in enumerate(shared)}
            pickler.dump(value)
            held = pickler.memo.copy()
            if units is not None:
                for key in units.ids:
                    held.pop(key, None)
            return buffer.getvalue(), held, pickler.class_members

        try:
            skeleton, held, members = dump([])
        except _NewUnit:
            raise
        except Exception:
            if not token_by_id:
                raise
            # Maybe a shared object inside cannot be pickled: refer to those without descending.
            small.clear()
            large.clear()
            if units is not None:
                units.used.clear()
                units.ids.clear()
            buffer = io.BytesIO()
            slow = _SharedRefPickler(buffer, namespace, on_tensor, token_by_id, units,
                                     self._view_roots)
            slow.dump(value)
            held = slow.memo.copy()
            for key in slow.class_members | (units.ids if units is not None else set()):
                held.pop(key, None)
            unit_refs = list(units.used) if units is not None else []
            return (_pack(buffer.getvalue(), small, slow.order, by_pid=True, units=unit_refs),
                    large, held, set(slow.order) | (units.tokens() if units is not None else set()))
        hits = held.keys() & token_by_id.keys()
        shared = sorted((token_by_id[key], held[key][1]) for key in hits)
        if shared:
            skeleton, held, members = dump(shared)
            for _, obj in shared:
                held.pop(id(obj), None)
        for key in members:
            held.pop(key, None)
        refs = [token for token, _ in shared]
        unit_refs = list(units.used) if units is not None else []
        return (_pack(skeleton, small, refs, units=unit_refs), large, held,
                set(refs) | (units.tokens() if units is not None else set()))

    def _entry(
        self, root: str, value: Any, payload: bytes, large: dict[str, str],
        uploads: dict[str, _Upload],
    ) -> SyncEntry:
        digest = _entry_digest(payload, large)
        size = len(payload)
        if size > self.threshold_bytes or _forced_pointer(value):
            # named by the stored bytes' own digest: the entry's, when no tensor rides apart
            key = object_key(self.kernel_id, _digest(payload) if large else digest)
            if key not in self._known_objects:
                uploads[key] = payload
            return SyncEntry(root, "pointer", digest, store_key=key, size=size, tensors=large)
        return SyncEntry(root, "inline", digest, payload=payload, size=size, tensors=large)

    def _tensor(
        self, tensor: Any, uploads: dict[str, _Upload], changed_tokens: set[str],
        verify: bool = False,
    ) -> tuple[str, _TensorRecord]:
        """The tensor's (or array's) token and record, serialised again if it changed.

        Unchanged means: torch's version counter and the rest of the fingerprint are the same
        and, with ``verify``, so are its bytes (a write through ``.data`` or ``.numpy()`` leaves
        the version counter alone). A leaf tensor whose gradient is another object (or none)
        counts as changed too, so the entries holding it are pickled again with the new one.
        """
        state = self.state
        token = state.token_for(tensor)
        record = state.record(token)
        if record is not None and token in self._hashed_in_encode:
            return token, record  # hashed, and its record refreshed, earlier in this encode
        fingerprint = _fingerprint(tensor)
        parts: list[bytes | memoryview] | None = None
        digest: str | None = None
        if record is not None and fingerprint is not None and record.fingerprint == fingerprint:
            same = True
            if verify and record.blob is not None:
                same = _content_of(tensor) == record.content
            elif verify:
                parts = _serialise_extracted(tensor)
                digest = _digest(*parts)
                same = digest == record.digest
                self._hashed_in_encode.add(token)
            if same:
                if record.store_key is not None and record.store_key not in self._known_objects:
                    # Known from an applied update or checkpoint: it is in the store already.
                    self._known_objects.add(record.store_key)
                grad = state.grad_token(tensor)
                if grad != record.grad:
                    record.grad = grad
                    changed_tokens.add(token)
                return token, record
        if parts is None:
            parts = _serialise_extracted(tensor)
        if digest is None:  # not hashed above
            digest = _digest(*parts)
        self._hashed_in_encode.add(token)
        if record is None or record.digest != digest:
            changed_tokens.add(token)
        if sum(memoryview(part).nbytes for part in parts) > TENSOR_INLINE_LIMIT:
            key = object_key(self.kernel_id, digest)
            if key not in self._known_objects:
                uploads[key] = parts
            state.remember(token, tensor, digest, None, key)
        else:
            state.remember(token, tensor, digest, b"".join(parts), None)
        if record is not None and record.grad != state.record(token).grad:  # type: ignore[union-attr]
            changed_tokens.add(token)
        return token, state.record(token)  # type: ignore[return-value]

    def _recheck(self, uploads: dict[str, _Upload], changed_tokens: set[str]) -> None:
        """Check every tensor and large array the synced namespace holds, named by the cell or
        not: ``W.data += 1``, ``opt.step()`` called through another object, a C extension
        writing into an array, ``backward()`` filling ``.grad``. Each whose bytes or gradient
        changed is serialised again, and the entries holding it are refreshed (``encode``).

        The cost is one hash of the bytes held (BLAKE3 over views of their memory, no copy, the
        GIL released), after the reply; docs/performance.md has the figure for 1 GiB."""
        state = self.state
        for record, obj in state.live_records():
            if record.blob is not None and type(record.content) is bytes:
                # a small tensor in plain CPU memory: compared here, without a call per step
                # (a model's hundreds of parameters; 1,000 of them in ~10 ms)
                if (record.fingerprint == _tensor_fingerprint(obj)
                        and record.content == _content_of(obj)
                        and record.grad == state.grad_token(obj)):
                    continue
            self._tensor(obj, uploads, changed_tokens, verify=True)

    def _upload(self, uploads: Mapping[str, _Upload]) -> None:
        """Put new objects (skipping those already stored), in parallel; before the update goes out."""
        def put(item: tuple[str, _Upload]) -> str:
            key, data = item
            if not self.store.exists(key):
                self.store.put(key, data)
            return key

        if not uploads:
            return
        if len(uploads) == 1:
            self._known_objects.add(put(next(iter(uploads.items()))))
            return
        with ThreadPoolExecutor(min(self._upload_threads, len(uploads))) as pool:
            self._known_objects.update(pool.map(put, uploads.items()))


class _Reach:
    """The objects reachable from those added (``gc.get_referents``), without crossing into the
    namespace, modules, classes or shared objects; bounded (beyond ``limit`` objects, anything
    not yet seen counts as not reachable, which can only make an extra token)."""

    def __init__(self, namespace: Any, token_by_id: Mapping[int, str],
                 limit: int = 200_000) -> None:
        self._namespace = id(namespace)
        self._shared = token_by_id
        self._seen: set[int] = set()
        self._limit = limit

    def reaches(self, obj: Any) -> bool:
        return id(obj) in self._seen

    def add(self, obj: Any) -> None:
        stack = list(gc.get_referents(obj))
        while stack and len(self._seen) < self._limit:
            item = stack.pop()
            key = id(item)
            if (key in self._seen or key == self._namespace or key in self._shared
                    or _untracked(type(item))):
                continue
            self._seen.add(key)
            stack.extend(gc.get_referents(item))


def _unsyncable_warning(what: str, exc: BaseException) -> str:
    """The cell-output warning for a value that cannot be serialised (``what``: which one)."""
    reason = f"{type(exc).__name__}: {exc}"
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return (
        f"NotebookOS: {what} could not be serialised and is not replicated to the "
        f"standby replicas ({reason}). It will be lost if this replica fails."
    )


def _names_reached_by_calls(namespace: Mapping[str, Any], called: Iterable[str]) -> set[str]:
    """For each called name: a notebook function -> the globals its code uses (transitively);
    a callable object (``model(x)``) -> the name itself; classes and builtins -> nothing."""
    reached: set[str] = set()
    seen: set[str] = set()
    pending = [n for n in called if n in namespace]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        value = namespace.get(name)
        if isinstance(value, types.FunctionType):
            for used in _code_globals(value.__code__):
                if used in namespace and not is_internal_name(used):
                    reached.add(used)
                    if isinstance(namespace[used], types.FunctionType):
                        pending.append(used)
        elif callable(value) and not isinstance(
            value, type | types.BuiltinFunctionType | types.ModuleType | types.MethodType
        ):
            reached.add(name)
    return reached


def _arrays_sharing_memory(namespace: Mapping[str, Any], mutated: Iterable[str]) -> set[str]:
    """Names bound to numpy arrays whose memory a mutated name's array shares: a write through
    a view (``x2_sub = x2[:2, :2]``, then ``x2_sub[0, 0] = 99``) changed ``x2`` too, and the
    other way round. Small arrays are copied per name (docs/state-sync.md), so the name the cell
    did not mention must be sent again. Names bound to arrays directly, bounds compared
    (``numpy.may_share_memory``): cheap, and a false positive costs one hash."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return set()
    written = [namespace[n] for n in mutated
               if type(namespace.get(n)) is numpy.ndarray]
    if not written:
        return set()
    return {name for name, value in namespace.items()
            if type(value) is numpy.ndarray and not is_internal_name(name)
            and any(value is not w and numpy.may_share_memory(value, w) for w in written)}


def _array_root(array: Any) -> Any:
    """The array whose memory ``array`` views (itself when it owns its memory, or when its
    memory is another object's, ``numpy.frombuffer``)."""
    numpy = sys.modules["numpy"]
    root = array
    while type(root.base) is numpy.ndarray:
        root = root.base
    return root


def _shared_array_memory(namespace: Mapping[str, Any]) -> tuple[dict[int, Any], dict[str, Any]]:
    """Arrays whose memory several names' arrays or tensors share (``x2_sub = x2[:2, :2]``,
    ``t = torch.from_numpy(x2)``: a write through one shows in the other), as (id -> that
    array, name -> the array its value views). A standby keeps them views of one array
    (``_array_view``, ``_tensor_over_array``) instead of a copy per name, so a write through
    one, on whichever replica runs the next cell, shows in the other. Only plain C-contiguous
    arrays at the root (a view of one is rebuilt on its buffer). A tensor over such an array
    is in the first map too, by its own id, with the array it lies in."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return {}, {}
    groups: dict[int, list[str]] = {}
    roots: dict[int, Any] = {}
    tensors: dict[str, Any] = {}
    torch = _torch()
    for name, value in namespace.items():
        if is_internal_name(name):
            continue
        if torch is not None and type(value) is torch.Tensor:
            tensors[name] = value
            continue
        if type(value) is not numpy.ndarray or value.dtype.hasobject:
            continue
        root = _array_root(value)
        if not root.flags.c_contiguous:
            continue
        roots[id(root)] = root
        groups.setdefault(id(root), []).append(name)
    over: dict[int, Any] = {}  # id(tensor) -> the root array whose memory it lies in
    if tensors and roots:
        spans = [(root.__array_interface__["data"][0], root.nbytes, key)
                 for key, root in roots.items()]
        for name, tensor in tensors.items():
            key = _array_holding(tensor, spans)
            if key is not None:
                over[id(tensor)] = roots[key]
                groups[key].append(name)
    shared = {key: roots[key] for key, names in groups.items() if len(names) > 1}
    members = {name: shared[key] for key, names in groups.items() if key in shared
               for name in names}
    shared.update(over)
    return shared, members


def _array_holding(tensor: Any, spans: list[tuple[int, int, int]]) -> int | None:
    """The key of the span (start, size, key) a CPU tensor's elements lie in, if any (a tensor
    made by ``torch.from_numpy`` or over an array's buffer); None for any other tensor."""
    if (tensor.device.type != "cpu" or tensor.requires_grad or tensor.is_sparse
            or tensor.is_quantized or tensor.dtype.is_complex or tensor.numel() == 0):
        return None
    try:
        start = tensor.numpy().__array_interface__["data"][0]
    except (RuntimeError, TypeError):  # a dtype numpy has not (bfloat16), a conjugate view
        return None
    for begin, size, key in spans:
        if begin <= start < begin + size:
            return key
    return None


def _view_arguments(view: Any, root: Any) -> tuple:
    """What ``_array_view`` needs to make ``view`` again on ``root``'s memory."""
    offset = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return (root, offset, view.shape, view.strides, view.dtype, bool(view.flags.writeable))


def _array_view(root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any,
                writeable: bool = True) -> Any:
    """A view of ``root``'s memory (a standby's copy of a view the executor's namespace holds)."""
    numpy = sys.modules.get("numpy") or importlib.import_module("numpy")
    view = numpy.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    if not writeable:
        view.flags.writeable = False
    return view


def _tensor_over_array(root: Any, offset: int, shape: tuple, strides: tuple, dtype: Any,
                       writeable: bool = True) -> Any:
    """A tensor over ``root``'s memory (``torch.from_numpy``), as the executor's namespace
    holds one: a write through the array shows in the tensor, and the other way round."""
    torch = _torch() or importlib.import_module("torch")
    return torch.from_numpy(_array_view(root, offset, shape, strides, dtype, True))


def _code_globals(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _code_globals(constant)
    return names


# ---------------------------------------------------------------------------------- applier


@dataclass
class RestoreSplit:
    """Where a checkpoint restore's time went (seconds): ``read_s`` until its last byte was in
    (the checkpoint's records and every large object fetched, in parallel with decoding what
    had arrived), ``apply_s`` the decoding left after that."""

    read_s: float = 0.0
    apply_s: float = 0.0


class StateApplier:
    """Applies updates on a standby; fetches large objects in the background."""

    def __init__(
        self, store: LargeObjectStore, *, state: SyncState | None = None, fetch_threads: int = 4
    ) -> None:
        self.store = store
        self.state = state or SyncState()
        self._pool = ThreadPoolExecutor(fetch_threads, thread_name_prefix="nbos-prefetch")
        self._fetches: dict[str, Future[bytes]] = {}
        self.last_fetch_done = 0.0  # time.monotonic() when the latest fetch ended
        self._fetch_lock = threading.Lock()
        self._closed = False

    def prefetch(self, update: SyncUpdate) -> None:
        """Start fetching the update's store objects that this replica does not hold yet.

        Returns at once and never blocks on an ``apply`` in progress (call it from the Raft thread).
        """
        for key, tensor in self._keys_needed(update):
            self._fetch(key, tensor)

    def _keys_needed(self, update: SyncUpdate) -> list[tuple[str, bool]]:
        """(store key, whether it holds a tensor or array) for each object to fetch."""
        # No state lock here: prefetch runs on the Raft thread and must never wait for an apply.
        keys = []
        for entry in update.entries:
            held = self.state.entries.get(entry.name)
            if held is not None and held.kind == entry.kind and held.digest == entry.digest:
                continue  # this replica made the update, or already applied it
            if entry.kind == "pointer" and entry.store_key:
                keys.append((entry.store_key, False))
            for token, key in entry.tensors.items():
                record = self.state.peek(token)
                if record is None or record.digest != _digest_of_key(key):
                    keys.append((key, True))
        return keys

    def _fetch(self, key: str, tensor: bool = False) -> Future[Any]:
        with self._fetch_lock:
            if self._closed:
                raise RuntimeError("the state applier is closed")
            future = self._fetches.get(key)
            if future is None:
                future = self._pool.submit(self._get, key, tensor)
                self._fetches[key] = future
            return future

    def _get(self, key: str, tensor: bool) -> Any:
        """The blob under ``key`` (``_fetch_blob``); notes when the fetch ended."""
        try:
            return self._fetch_blob(key, tensor)
        finally:
            self.last_fetch_done = max(self.last_fetch_done, time.monotonic())

    def _fetch_blob(self, key: str, tensor: bool) -> Any:
        """A tensor's or array's blob lands in a tensor's own memory when torch is loaded, so
        loading it makes no copy (raw_tensor.py); anything else is bytes."""
        if tensor and "torch" in sys.modules:
            # not _torch(): a standby's apply thread may be importing torch right now (the
            # update holds torch objects) and a half-imported torch crashes the process
            # (SIGSEGV in torch.empty); importing waits for that import to finish
            torch = importlib.import_module("torch")
            return raw_tensor.fetch_into_tensor(torch, self.store, key)
        return self.store.get(key)

    def _object(self, key: str, tensor: bool = False) -> Any:
        """The object's blob: from a prefetch, or fetched now.

        Not hashed again: the store checked its HMAC, which binds these bytes to ``key``, and
        the key names the digest its writer computed from them. A tensor's blob is handed over
        (forgotten here): the tensor loaded from it may be that very memory, so a second use
        of the key fetches again rather than share it.
        """
        future = self._fetch(key, tensor)
        if tensor:
            with self._fetch_lock:
                if self._fetches.get(key) is future:
                    del self._fetches[key]
        return future.result()

    def apply(self, namespace: MutableMapping[str, Any], update: SyncUpdate) -> None:
        """Apply every entry that can be applied; then raise ``SyncApplyError`` naming the others.

        A failed entry leaves that name's previous value in place. Shared objects are applied
        first, in two steps (an empty object for each new one, then every object's contents, in
        place for those this replica holds already), so that values referencing them, and cycles
        among them, resolve to the one object each token names.
        """
        failures: dict[str, str] = {}
        objects = [e for e in update.entries if is_object_root(e.name)]
        names = [e for e in update.entries if not is_object_root(e.name)]
        try:
            with self.state.lock, _cyclic_gc_paused():
                fills = []
                for entry in objects:
                    try:
                        fill = self._object_shell(namespace, entry)
                    except Exception as exc:  # noqa: BLE001 - report per entry
                        self._failed(failures, entry, exc)
                    else:
                        if fill is not None:
                            fills.append(fill)
                for entry, obj, existing, payload in self._fill_order(fills):
                    try:
                        self._fill_object(namespace, entry, obj, existing, payload)
                    except Exception as exc:  # noqa: BLE001 - report per entry
                        self._failed(failures, entry, exc)
                for entry in names:
                    try:
                        self._apply_entry(namespace, entry)
                    except Exception as exc:  # noqa: BLE001 - report per variable
                        self._failed(failures, entry, exc)
                for entry in objects:
                    if entry.kind == "deleted":
                        token = token_of_root(entry.name)
                        if token in self.state.identity.units:
                            release_unit(self.state.identity.shared.get(token))
                        self.state.identity.drop(token)
                        self.state.dirty.add(entry.name)
                        self.state.entries.pop(entry.name, None)
                        self.state.entry_tokens.pop(entry.name, None)
                self.state.prune()
        finally:
            self._forget_fetches(update)
        if failures:
            raise SyncApplyError(failures)

    @staticmethod
    def _failed(failures: dict[str, str], entry: SyncEntry, exc: Exception) -> None:
        failures[entry.name] = f"{type(exc).__name__}: {exc}"
        log.warning("state sync: could not apply %r: %s", entry.name, exc)

    def _unchanged(self, entry: SyncEntry, present: bool) -> bool:
        """This replica already holds exactly this value (it encoded it itself, or the update
        is replayed): it keeps the object, and with it every alias of it."""
        current = self.state.entries.get(entry.name)
        return (current is not None and current.kind == entry.kind
                and current.digest == entry.digest and present)

    def _payload(self, entry: SyncEntry) -> bytes:
        if entry.kind == "inline":
            payload = entry.payload
        else:
            assert entry.store_key is not None
            payload = self._object(entry.store_key)
        assert payload is not None
        if _entry_digest(payload, entry.tensors, like=entry.digest) != entry.digest:
            raise ValueError("payload does not match the entry's digest (corrupted or tampered)")
        return payload

    def _object_shell(
        self, namespace: MutableMapping[str, Any], entry: SyncEntry
    ) -> tuple[SyncEntry, Any, bool, bytes] | None:
        """Step one for a shared object: the object to fill (this replica's, or a new empty one)."""
        if entry.kind == "deleted":
            return None
        token = token_of_root(entry.name)
        identity = self.state.identity
        if self._unchanged(entry, token in identity.shared):
            return None
        if entry.kind not in ("inline", "pointer"):
            raise ValueError(f"a shared object cannot be a {entry.kind!r} entry")
        payload = self._payload(entry)
        if payload[:1] != _OBJECT_PAYLOAD:
            raise ValueError("payload is not a shared object")
        plain = _PlainUnpickler(io.BytesIO(payload[1:])).load()
        if not (isinstance(plain, dict) and isinstance(plain.get("s"), bytes)
                and isinstance(plain.get("f"), bytes)):
            raise ValueError("malformed shared object payload")
        obj = identity.shared.get(token)
        existing = obj is not None
        if obj is None:
            shell = _ValueUnpickler(plain["s"], namespace, _no_tensors).load()
            obj = make_shell(shell)
            identity.adopt(token, obj)
        return entry, obj, existing, plain["f"]

    def _fill_order(
        self, fills: list[tuple[SyncEntry, Any, bool, bytes]]
    ) -> list[tuple[SyncEntry, Any, bool, bytes]]:
        """The order in which to fill shared objects: as an unpickler would, each after those its
        contents refer to (cycles broken where they close), so that a ``__setstate__`` that calls
        into another shared object (``Figure.__setstate__`` rescales its transform) finds it
        filled; units first, as the others may refer to objects inside them."""
        by_token = {token_of_root(fill[0].name): fill for fill in fills}
        deps: dict[str, list[str]] = {}
        for token, (_, _, _, payload) in by_token.items():
            try:
                _, _, shared, _, unit_refs = _unpack(payload)
            except Exception:  # noqa: BLE001 - reported when it is filled
                shared, unit_refs = [], []
            deps[token] = sorted(
                {ref.partition("#")[0] for ref in unit_refs} | set(shared) & by_token.keys())
        units = self.state.identity.units
        order: list[tuple[SyncEntry, Any, bool, bytes]] = []
        seen: set[str] = set()
        for first in sorted(by_token, key=lambda token: token not in units):
            if first in seen:
                # Filled already, as a dependency of an earlier one. Filling it twice extended a
                # new list (not cleared first) with its items again: [box] became [box, box] on
                # the standbys whenever the update listed a referrer before what it refers to.
                continue
            stack = [(first, iter(deps[first]))]
            seen.add(first)
            while stack:
                token, pending = stack[-1]
                for dep in pending:
                    if dep not in seen and dep in by_token:
                        seen.add(dep)
                        stack.append((dep, iter(deps[dep])))
                        break
                else:
                    stack.pop()
                    order.append(by_token[token])
        return order

    def _fill_object(
        self, namespace: MutableMapping[str, Any], entry: SyncEntry, obj: Any, existing: bool,
        payload: bytes,
    ) -> None:
        """Step two: give the object its contents (in place when this replica held it)."""
        fill, held, refs, tokens = self._load(namespace, entry, payload)
        fill_object(obj, fill, existing=existing)
        self.state.identity.register(entry.name, held, refs, entry.digest)
        self.state.entries[entry.name] = entry
        self.state.dirty.add(entry.name)
        self.state.entry_tokens[entry.name] = frozenset(tokens)

    def _load(
        self, namespace: MutableMapping[str, Any], entry: SyncEntry, payload: bytes
    ) -> tuple[Any, Held, set[str], set[str]]:
        """Unpickle a value payload: (value, its inline objects, shared tokens, tensor tokens)."""
        skeleton, small, refs, by_pid, unit_refs = _unpack(payload)
        resolve = _TensorResolver(self, entry, small)
        shared = [self._shared(token) for token in refs]
        allowed = set(unit_refs)

        def unit(ref: str) -> Any:
            if ref not in allowed:
                raise pickle.UnpicklingError(f"unit reference {ref!r} not listed in the payload")
            return self.state.identity.resolve_ref(ref)

        unpickler = _ValueUnpickler(skeleton, namespace, resolve, shared, by_pid, unit)
        value = unpickler.load()
        return (value, unpickler.held(), set(refs) | {ref.partition("#")[0] for ref in allowed},
                resolve.tokens)

    def _shared(self, token: str) -> Any:
        obj = self.state.identity.shared.get(token)
        if obj is None:
            raise ValueError(f"shared object {token} is not available on this replica")
        return obj

    def discard(self, update: SyncUpdate) -> None:
        """Drop the prefetched objects of an update that will not be applied."""
        self._forget_fetches(update)

    def _forget_fetches(self, update: SyncUpdate) -> None:
        with self._fetch_lock:
            for entry in update.entries:
                for key in [entry.store_key, *entry.tensors.values()]:
                    if key is not None:
                        self._fetches.pop(key, None)

    def _apply_entry(self, namespace: MutableMapping[str, Any], entry: SyncEntry) -> None:
        identity = self.state.identity
        self.state.dirty.add(entry.name)
        if rng_state.is_rng_root(entry.name):
            self._apply_rng(entry)
            return
        if entry.kind == "deleted":
            namespace.pop(entry.name, None)
            self.state.entries.pop(entry.name, None)
            self.state.entry_tokens.pop(entry.name, None)
            identity.unregister(entry.name)
            return
        if self._unchanged(entry, entry.name in namespace):
            return
        if entry.kind == "module":
            assert entry.module is not None
            namespace[entry.name] = importlib.import_module(entry.module)
            self.state.entries[entry.name] = entry
            self.state.entry_tokens.pop(entry.name, None)
            identity.register(entry.name, {}, ())
            return
        value, held, refs, tokens = self._load(namespace, entry, self._payload(entry))
        namespace[entry.name] = value
        self.state.entries[entry.name] = entry
        self.state.entry_tokens[entry.name] = frozenset(tokens)
        identity.register(entry.name, held, refs)

    def _apply_rng(self, entry: SyncEntry) -> None:
        if entry.kind == "deleted":
            self.state.entries.pop(entry.name, None)
            return
        if entry.kind != "inline":
            raise ValueError("the random generators' states must be an inline entry")
        current = self.state.entries.get(entry.name)
        if current is not None and current.digest == entry.digest:
            return  # set already (this replica captured it, or the update is replayed)
        payload = self._payload(entry)
        if payload[:1] != _PLAIN_PAYLOAD:
            raise ValueError("malformed random generator state")
        rng_state.restore(rng_state.from_bytes(payload[1:]))
        self.state.entries[entry.name] = entry

    def close(self) -> None:
        """Stop the fetch threads (pending fetches are abandoned). Safe to call twice."""
        with self._fetch_lock:
            self._closed = True
            for future in self._fetches.values():
                future.cancel()
            self._fetches.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> StateApplier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _no_tensors(token: str, kind: str) -> Any:
    raise ValueError(f"a shared object's constructor cannot hold a tensor ({token})")


class _TensorResolver:
    """Finds the tensor (or array) for a token: the one this replica holds, updated if it changed."""

    def __init__(self, applier: StateApplier, entry: SyncEntry, small: Mapping[str, bytes]) -> None:
        self.applier = applier
        self.entry = entry
        self.small = small
        self.tokens: set[str] = set()

    def __call__(self, token: str, kind: str) -> Any:
        state = self.applier.state
        self.tokens.add(token)
        if token in self.small:
            blob: bytes | None = self.small[token]
            digest = _digest(blob)  # covered by the entry digest already
            key = None
        elif token in self.entry.tensors:
            key = self.entry.tensors[token]
            digest = _digest_of_key(key)
            blob = None
        else:
            raise ValueError(f"tensor {token} is referenced but not carried by the entry")
        record = state.record(token)
        current = record.ref() if record is not None else None
        if current is not None and record is not None and record.digest == digest:
            return current
        if blob is None:
            assert key is not None
            blob = self.applier._object(key, tensor=True)
        if kind == "torch":
            loaded = _deserialise_tensor(blob)
            if current is not None and _replace_tensor_data(current, loaded):
                loaded = current
        else:
            loaded = _deserialise_array(blob)
            if current is not None and _replace_array_data(current, loaded):
                loaded = current
        state.remember(token, loaded, digest, blob if key is None else None, key)
        return loaded

    def grad_set(self, token: str, tensor: Any) -> None:
        """The tensor was given its gradient after it was recorded: record that too, so that
        this replica, as executor, sends the tensor again only when its gradient changes."""
        record = self.applier.state.record(token)
        if record is not None:
            record.grad = self.applier.state.grad_token(tensor)


def _set_grad(tensor: Any, grad: Any) -> Any:
    """Give a leaf tensor the executor's gradient (or none)."""
    if tensor.grad is not grad:
        torch = _torch()
        assert torch is not None
        with torch.no_grad():
            tensor.grad = grad
    return tensor


def _replace_tensor_data(current: Any, loaded: Any) -> bool:
    """Give ``current`` the contents of ``loaded`` in place, so every holder sees them."""
    torch = _torch()
    if torch is None or type(current) is not type(loaded):
        return False
    if not torch._has_compatible_shallow_copy_type(current, loaded):
        return False
    with torch.no_grad():
        current.data = loaded.data
    if current.is_leaf and current.requires_grad != loaded.requires_grad:
        current.requires_grad_(loaded.requires_grad)
    return True


def _replace_array_data(current: Any, loaded: Any) -> bool:
    """Copy ``loaded`` into ``current`` when shape and dtype agree (numpy cannot rebind data)."""
    numpy = sys.modules.get("numpy")
    if numpy is None or type(current) is not numpy.ndarray:
        return False
    if current.shape != loaded.shape or current.dtype != loaded.dtype:
        return False
    if not current.flags.writeable:
        return False
    current[...] = loaded
    return True


# ------------------------------------------------------------------------------ checkpoints


def write_checkpoint(
    store: LargeObjectStore, kernel_id: str, entries: Mapping[str, SyncEntry], execution_count: int,
    *, epoch: int = 0,
) -> tuple[int, int] | None:
    """Store the synced namespace (inline values, pointers to objects already in the store),
    fenced with ``(epoch, execution_count)``: None when written, else the fence of the newer
    checkpoint the store holds, which stays (``LargeObjectStore.put_fenced``)."""
    return store.put_fenced(
        checkpoint_key(kernel_id),
        checkpoint_bytes(kernel_id, entries, execution_count, epoch=epoch),
        (epoch, execution_count))


def checkpoint_bytes(
    kernel_id: str, entries: Mapping[str, SyncEntry], execution_count: int,
    *, keep_deleted: bool = False, modules: list[str] | None = None, epoch: int = 0,
) -> bytes:
    """A checkpoint record (also a part of a segmented one: then ``keep_deleted``)."""
    if not isinstance(execution_count, int) or execution_count < 0:
        raise ValueError(f"execution_count must be a non-negative int, not {execution_count!r}")
    plain = {
        "v": 1,
        "kernel_id": kernel_id,
        "execution_count": execution_count,
        "e": [entry.to_plain() for entry in entries.values()
              if keep_deleted or entry.kind != "deleted"],
    }
    if modules:
        plain["m"] = list(modules)
    if epoch:
        plain["epoch"] = epoch
    return CHECKPOINT_MAGIC + pickle.dumps(plain, protocol=5)


def manifest_bytes(kernel_id: str, base: str, segments: list[str], execution_count: int,
                   epoch: int = 0) -> bytes:
    """A segmented checkpoint: the store keys of a full part and of the changes since, in order."""
    plain = {"v": 1, "kernel_id": kernel_id, "execution_count": execution_count,
             "base": base, "segments": list(segments), "epoch": epoch}
    return CHECKPOINT_MANIFEST_MAGIC + pickle.dumps(plain, protocol=5)


def _checkpoint_part(data: bytes) -> tuple[list[SyncEntry], int, str, list[str]]:
    plain = _load_plain(data, CHECKPOINT_MAGIC, "checkpoint")
    entries = plain.get("e")
    count = plain.get("execution_count")
    if not isinstance(entries, list) or not isinstance(count, int):
        raise ValueError("malformed checkpoint: entries must be a list, execution_count an int")
    return ([SyncEntry.from_plain(e) for e in entries], count, str(plain.get("kernel_id")),
            _module_names(plain, "checkpoint"))


def stored_checkpoint_count(store: LargeObjectStore, kernel_id: str) -> int:
    """The cell number of the kernel's checkpoint in the store (0 when it has none): its
    manifest alone is read, or the one record of the older format."""
    try:
        data = store.get(checkpoint_key(kernel_id))
    except KeyNotFound:
        return 0
    if not bytes(data[:len(CHECKPOINT_MANIFEST_MAGIC)]) == CHECKPOINT_MANIFEST_MAGIC:
        return _checkpoint_part(data)[1]
    count = _load_plain(data, CHECKPOINT_MANIFEST_MAGIC, "checkpoint manifest").get(
        "execution_count")
    return count if isinstance(count, int) else 0


def read_checkpoint(store: LargeObjectStore, kernel_id: str) -> Checkpoint:
    """The kernel's last checkpoint; ``KeyNotFound`` if it has none, ValueError if malformed.

    Either one record, or a manifest naming a full part and the segments written since (each the
    names changed in between, deletions included), applied in order.
    """
    data = store.get(checkpoint_key(kernel_id))
    if not bytes(data[:len(CHECKPOINT_MANIFEST_MAGIC)]) == CHECKPOINT_MANIFEST_MAGIC:
        decoded, count, kid, modules = _checkpoint_part(data)
        return Checkpoint({e.name: e for e in decoded if e.kind != "deleted"}, count, kid,
                          modules, _epoch_of(_load_plain(data, CHECKPOINT_MAGIC, "checkpoint")))
    plain = _load_plain(data, CHECKPOINT_MANIFEST_MAGIC, "checkpoint manifest")
    base, segments, count = plain.get("base"), plain.get("segments"), plain.get("execution_count")
    if not (isinstance(base, str) and isinstance(segments, list) and isinstance(count, int)
            and all(isinstance(key, str) for key in segments)):
        raise ValueError("malformed checkpoint manifest")
    entries: dict[str, SyncEntry] = {}
    modules: dict[str, None] = {}
    for key in [base, *segments]:
        part_entries, _, _, part_modules = _checkpoint_part(store.get(key))
        for entry in part_entries:
            if entry.kind == "deleted":
                entries.pop(entry.name, None)
            else:
                entries[entry.name] = entry
        modules.update(dict.fromkeys(part_modules))
    return Checkpoint(entries, count, str(plain.get("kernel_id")), list(modules),
                      _epoch_of(plain))


def _epoch_of(plain: Mapping[str, Any]) -> int:
    """A checkpoint record's incarnation (0 in those written before epochs)."""
    epoch = plain.get("epoch", 0)
    return epoch if isinstance(epoch, int) and epoch >= 0 else 0


def restore_namespace(
    store: LargeObjectStore,
    checkpoint: Checkpoint,
    namespace: MutableMapping[str, Any],
    *,
    state: SyncState | None = None,
    split: RestoreSplit | None = None,
    started: float | None = None,
) -> list[str]:
    """Load a checkpoint into ``namespace``; return the names that could not be restored.

    Pass the replica's ``SyncState`` so that its encoder continues from the restored state;
    ``split`` is filled with where the time went since ``started`` (``time.monotonic()`` when
    the checkpoint's read began; default: now).
    """
    started = time.monotonic() if started is None else started
    update = SyncUpdate(list(checkpoint.entries.values()))
    failed: list[str] = []
    with StateApplier(store, state=state) as applier:
        records_read = time.monotonic()
        applier.prefetch(update)
        try:
            applier.apply(namespace, update)
        except SyncApplyError as exc:
            for name, reason in exc.failures.items():
                log.error("checkpoint restore of kernel %s: %r not restored: %s",
                          checkpoint.kernel_id, name, reason)
            failed = sorted(exc.failures)
        read_until = max(records_read, applier.last_fetch_done)
    if split is not None:
        split.read_s = read_until - started
        split.apply_s = time.monotonic() - read_until
    return failed
