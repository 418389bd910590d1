"""The raw format of large dense tensors in the store, and reading one without a copy.

A blob is: magic, the header's length (4 bytes), a plain-pickle header (dtype, shape, grad flags),
zero padding up to a multiple of ``ALIGN`` bytes, then the tensor's element bytes. Writing makes
no copy (the body is a view of the tensor's memory) and hashing and storing a view release the
GIL, so a 1 GiB tensor does not stall the replica's other threads.

Reading: a standby fetches the blob straight into a fresh uint8 tensor it alone holds
(``fetch_into_tensor``: the store writes into that tensor's memory) and the loaded tensor is
that memory from the padding on (``load``): the bytes are received once and never copied. Blobs
written before the padding (elements not aligned to their dtype) and blobs in bytes are copied
once, as before.
"""

from __future__ import annotations

import ctypes
import io
import math
import pickle
import struct
import warnings
from typing import Any

from notebookos.kernel.plain_pickle import PlainUnpickler
from notebookos.store.base import LargeObjectStore

MAGIC = b"NBTRAW1\n"
HEADER_LENGTH = struct.Struct(">I")
PIECE = 64 * 1024 * 1024
ALIGN = 64


def parts(torch: Any, tensor: Any, inline_limit: int) -> list[bytes | memoryview] | None:
    """The raw format's pieces, or None when the tensor needs torch.save (small or exotic)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided:
        return None
    if tensor.is_quantized or tensor.nbytes <= inline_limit or tensor.device.type == "meta":
        return None
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.resolve_conj().resolve_neg().contiguous()
    body = memory_of(data)
    header = pickle.dumps(
        {
            "v": 1, "dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape),
            "requires_grad": bool(tensor.requires_grad),
            "parameter": isinstance(tensor, torch.nn.Parameter),
        },
        protocol=5,
    )
    header += b"\0" * (-(len(MAGIC) + HEADER_LENGTH.size + len(header)) % ALIGN)
    pieces = [body[i:i + PIECE] for i in range(0, body.nbytes, PIECE)]
    return [MAGIC + HEADER_LENGTH.pack(len(header)) + header, *pieces]


def memory_of(tensor: Any) -> memoryview:
    """A read-only view of a contiguous CPU tensor's bytes that keeps the tensor alive.

    ctypes over its memory, not ``.numpy()``: that marks the storage unresizable for good, and
    the user's ``x.resize_()`` then failed after the cell that made ``x``. The view is used
    only while the cell's update is encoded and uploaded, before the next cell runs."""
    nbytes = tensor.numel() * tensor.element_size()
    if not nbytes:
        return memoryview(b"")
    return memoryview(_memory(tensor, nbytes)).cast("B").toreadonly()


def _memory(tensor: Any, nbytes: int) -> Any:
    """A writable buffer over the first ``nbytes`` of a CPU tensor's memory that keeps the tensor
    alive (ctypes, not ``.numpy()``: see ``memory_of``)."""
    memory = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    memory.owner = tensor
    return memory


def fetch_into_tensor(torch: Any, store: LargeObjectStore, key: str) -> Any:
    """The value under ``key`` in a new uint8 tensor's own memory (``store.get_into``)."""
    holder: list[Any] = []

    def allocate(length: int) -> Any:
        buffer = torch.empty(length, dtype=torch.uint8)
        holder.append(buffer)
        return _memory(buffer, length) if length else bytearray()

    store.get_into(key, allocate)
    return holder[0]


def is_raw(blob: Any) -> bool:
    return _prefix(blob, len(MAGIC)) == MAGIC


def load(torch: Any, blob: Any) -> Any:
    """The tensor of a raw blob: ``bytes``-like (copied once) or a uint8 tensor from
    ``fetch_into_tensor`` (used in place when aligned: the caller must hold no other use of it)."""
    start = len(MAGIC)
    (header_length,) = HEADER_LENGTH.unpack(_prefix(blob, start + HEADER_LENGTH.size)[start:])
    start += HEADER_LENGTH.size
    header = PlainUnpickler(io.BytesIO(_prefix(blob, start + header_length)[start:])).load()
    start += header_length
    dtype = getattr(torch, str(header.get("dtype")), None)
    shape = header.get("shape")
    if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or not all(
        isinstance(n, int) and n >= 0 for n in shape
    ):
        raise ValueError("raw tensor header is malformed")
    count = math.prod(shape) * dtype.itemsize
    if _length(blob) - start != count:
        raise ValueError(f"raw tensor holds {_length(blob) - start} bytes, its header says {count}")
    if isinstance(blob, torch.Tensor) and start % dtype.itemsize == 0:
        tensor = torch.empty(0, dtype=dtype).set_(
            blob.untyped_storage(), start // dtype.itemsize, shape, _contiguous_strides(shape))
    elif isinstance(blob, torch.Tensor):
        tensor = blob[start:].clone().view(dtype).reshape(shape)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only buffer: cloned at once
            raw = torch.frombuffer(blob, dtype=torch.uint8, offset=start, count=count)
        tensor = raw.clone().view(dtype).reshape(shape)
    if header.get("parameter"):
        return torch.nn.Parameter(tensor, requires_grad=bool(header.get("requires_grad")))
    return tensor.requires_grad_(bool(header.get("requires_grad")))


def load_array(numpy: Any, blob: Any) -> Any:
    """A numpy array from ``numpy.save`` bytes (no pickle inside): ``bytes``-like (copied once)
    or a uint8 tensor from ``fetch_into_tensor``, whose memory the array then is (no copy; the
    caller must hold no other use of it)."""
    if isinstance(blob, bytes | bytearray | memoryview):
        return numpy.load(io.BytesIO(blob), allow_pickle=False)
    from numpy.lib import format as npy

    head = io.BytesIO(_prefix(blob, 64 * 1024))
    version = npy.read_magic(head)
    if version == (1, 0):
        shape, fortran, dtype = npy.read_array_header_1_0(head)
    elif version == (2, 0):
        shape, fortran, dtype = npy.read_array_header_2_0(head)
    else:
        return numpy.load(io.BytesIO(as_bytes(blob)), allow_pickle=False)
    if dtype.hasobject:
        raise ValueError("an object array is never loaded from the store (it would unpickle)")
    start, count = head.tell(), math.prod(shape)
    if _length(blob) - start != count * dtype.itemsize:
        raise ValueError(f"array holds {_length(blob) - start} bytes, its header says "
                         f"{count * dtype.itemsize}")
    flat = numpy.frombuffer(_memory(blob, blob.numel()), dtype=dtype, count=count, offset=start)
    return flat.reshape(shape, order="F" if fortran else "C")


def as_bytes(blob: Any) -> bytes | bytearray | memoryview:
    """A fetched blob as bytes (a copy when it sits in a tensor)."""
    if isinstance(blob, bytes | bytearray | memoryview):
        return blob
    return ctypes.string_at(blob.data_ptr(), blob.numel()) if blob.numel() else b""


def _prefix(blob: Any, length: int) -> bytes:
    if isinstance(blob, bytes | bytearray | memoryview):
        return bytes(blob[:length])
    return ctypes.string_at(blob.data_ptr(), min(length, blob.numel())) if blob.numel() else b""


def _length(blob: Any) -> int:
    return len(blob) if isinstance(blob, bytes | bytearray | memoryview) else blob.numel()


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]
