"""Hostile input for the daemons: hypothesis strategies over the gRPC services' protobuf messages
and over Jupyter messages for a kernel's front, and the checks that a daemon survived them.

Used by tests/schedulers/test_fuzz.py (a bounded number of examples in ``make test``) and by
benchmarks/fuzz.py (long campaigns). docs/security.md says what is fuzzed.

The gRPC calls are split by what they may do to a cluster: ``read`` methods take any value
(known ids included); ``order`` methods (stop, interrupt, migrate, commit, ...) only ever get ids
no kernel or host has, so a well-formed request is refused (NOT_FOUND, ...) and the cluster stays
as it was; ``StartKernel`` always names the running kernel (ALREADY_EXISTS after every field was
validated); the Local Scheduler's ``StartReplica`` and ``Shutdown`` are orders that do what they
say for any holder of a certificate, so they get only bytes that are not their message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor as pb_descriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from notebookos.proto import global_scheduler_pb2, local_scheduler_pb2

GS_SERVICE = global_scheduler_pb2.DESCRIPTOR.services_by_name["GlobalScheduler"]
LS_SERVICE = local_scheduler_pb2.DESCRIPTOR.services_by_name["LocalScheduler"]
HOST_METHODS = ("RegisterHost", "Heartbeat", "DeregisterHost", "ReportReplicaEvent")
READ_METHODS = ("GetKernelStatus", "ListKernels", "GetClusterStatus", "GetHostStatus")
BYTES_ONLY = ("StartReplica", "Shutdown")  # Local Scheduler orders with no refusal to reach
# Held open on purpose until the daemon stops (the Global Scheduler's watch of a Local
# Scheduler): fuzzed with ``answer_now`` only, so every call gets its answer
LONG_POLL = ("WatchHost",)
OVERSIZE = 5 * 1024 * 1024  # above gRPC's 4 MiB receive limit
ID_FIELDS = ("kernel_id", "host_id", "instance_id", "request_id")

_T = pb_descriptor.FieldDescriptor
_INT_BOUNDS = {
    _T.TYPE_INT32: (-2**31, 2**31 - 1), _T.TYPE_SINT32: (-2**31, 2**31 - 1),
    _T.TYPE_SFIXED32: (-2**31, 2**31 - 1), _T.TYPE_INT64: (-2**63, 2**63 - 1),
    _T.TYPE_SINT64: (-2**63, 2**63 - 1), _T.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    _T.TYPE_UINT32: (0, 2**32 - 1), _T.TYPE_FIXED32: (0, 2**32 - 1),
    _T.TYPE_UINT64: (0, 2**64 - 1), _T.TYPE_FIXED64: (0, 2**64 - 1),
}

HOSTILE_TEXT = st.one_of(
    st.sampled_from(["", " ", "x" * 70_000, "\x00", "../../../etc/passwd", "127.0.0.1:0",
                     "a:b:c", ":", "-1", "NaN", "🚀" * 50, "\u202e", "k" * 300]),
    st.text(max_size=40),
)


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({lo, hi, 0, 1, -1, 2, 1000, 10**6, 2**31 - 1, -2**31} & set(range(lo, hi + 1))
                   if hi - lo < 10 else {v for v in (lo, hi, 0, 1, -1, 2, 1000, 10**6,
                                                      2**31 - 1, -2**31, 2**53) if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _scalar(f: pb_descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    if f.type in _INT_BOUNDS:
        return _int(*_INT_BOUNDS[f.type])
    if f.type == _T.TYPE_DOUBLE:
        return st.one_of(st.sampled_from([0.0, -1.0, 1e308, -1e308, math.inf, -math.inf,
                                          math.nan, 5e-324]), st.floats())
    if f.type == _T.TYPE_FLOAT:
        return st.one_of(st.sampled_from([0.0, -1.0, math.inf, -math.inf, math.nan, 3e38]),
                         st.floats(width=32))
    if f.type == _T.TYPE_BOOL:
        return st.booleans()
    if f.type == _T.TYPE_STRING:
        return HOSTILE_TEXT
    if f.type == _T.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * 70_000))
    if f.type == _T.TYPE_ENUM:  # proto3 enums are open: unknown numbers parse
        return st.one_of(st.sampled_from([v.number for v in f.enum_type.values]),
                         st.integers(-5, 1000))
    raise TypeError(f"no strategy for field {f.full_name} of type {f.type}")


def _is_repeated(f: pb_descriptor.FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def message_fields(descriptor: pb_descriptor.Descriptor,
                   depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Field values for a message of ``descriptor``: any subset of its fields, hostile values."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in descriptor.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            if value.message_type is not None:
                continue
            parts[f.name] = st.dictionaries(_scalar(key), _scalar(value), max_size=3)
        elif f.message_type is not None:
            if depth >= 2:
                continue
            one = message_fields(f.message_type, depth + 1)
            parts[f.name] = st.lists(one, max_size=3) if _is_repeated(f) else one
        else:
            parts[f.name] = st.lists(_scalar(f), max_size=4) if _is_repeated(f) else _scalar(f)
    return st.fixed_dictionaries({}, optional=parts)


def build(message_class: type[Message], values: dict[str, Any]) -> Message:
    msg = message_class()
    _fill(msg, values)
    return msg


def _fill(msg: Message, values: dict[str, Any]) -> None:
    for name, value in values.items():
        f = msg.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            for k, v in value.items():
                target[k] = v
        elif f.message_type is not None and _is_repeated(f):
            for item in value:
                _fill(target.add(), item)
        elif f.message_type is not None:
            target.SetInParent()
            _fill(target, value)
        elif _is_repeated(f):
            target.extend(value)
        else:
            setattr(msg, name, value)


def _replace_ids(msg: Message, known: frozenset[str]) -> None:
    """No id of a running kernel or host: an order can then only be refused."""
    for f, value in msg.ListFields():
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            continue
        if f.message_type is not None:
            for item in (value if _is_repeated(f) else [value]):
                _replace_ids(item, known)
        elif f.name in ID_FIELDS and f.type == _T.TYPE_STRING and not _is_repeated(f) \
                and value in known:
            setattr(msg, f.name, f"unknown-{value}")


@dataclass(frozen=True)
class Call:
    service: str  # "gs" or "ls"
    method: str
    payload: bytes  # what goes on the wire
    token: bool = False  # present the cluster join token
    typed: bool = True  # payload is a well-formed message of the method's request type
    note: str = ""

    def __repr__(self) -> str:
        return (f"Call({self.service}.{self.method}, {len(self.payload)} bytes, "
                f"token={self.token}, typed={self.typed}{', ' + self.note if self.note else ''})")


def _method_classes(service: pb_descriptor.ServiceDescriptor,
                    module: Any) -> dict[str, type[Message]]:
    return {m.name: getattr(module, m.input_type.name) for m in service.methods}


GS_REQUESTS = _method_classes(GS_SERVICE, global_scheduler_pb2)
LS_REQUESTS = _method_classes(LS_SERVICE, local_scheduler_pb2)


def calls(kernel_id: str, known_ids: frozenset[str]) -> st.SearchStrategy[Call]:
    """One hostile call to a Global or Local Scheduler of a cluster whose only kernel is
    ``kernel_id`` and whose kernels and hosts are ``known_ids``."""

    @st.composite
    def typed(draw: st.DrawFn) -> Call:
        service = draw(st.sampled_from(["gs", "ls"]))
        requests = GS_REQUESTS if service == "gs" else LS_REQUESTS
        names = sorted(m for m in requests if m not in BYTES_ONLY)
        method = draw(st.sampled_from(names))
        cls = requests[method]
        msg = build(cls, draw(message_fields(cls.DESCRIPTOR)))
        token = draw(st.booleans()) if service == "gs" else False
        if method == "StartKernel":
            msg.kernel_id = kernel_id
        elif method in LONG_POLL:
            msg.answer_now = True
        elif method == "SetPrewarmPool":
            msg.target_size = draw(st.one_of(st.integers(-2**31, -1),
                                              st.integers(min_value=65, max_value=2**31 - 1)))
        elif method == "RegisterHost" and token:
            msg.address = msg.address.replace(":", "")  # never a usable host (no port)
        elif method not in READ_METHODS:
            _replace_ids(msg, known_ids)
        if method in HOST_METHODS and token and method != "RegisterHost":
            _replace_ids(msg, known_ids)
        return Call(service, method, msg.SerializeToString(), token=token)

    @st.composite
    def raw(draw: st.DrawFn) -> Call:
        service = draw(st.sampled_from(["gs", "ls"]))
        requests = GS_REQUESTS if service == "gs" else LS_REQUESTS
        method = draw(st.sampled_from(sorted(m for m in requests if m not in LONG_POLL)))
        kind = draw(st.sampled_from(["random", "other message", "truncated"]))
        if kind == "random":
            payload = draw(st.binary(min_size=1, max_size=256))
            if method in BYTES_ONLY:  # bytes that can never parse as a message
                payload = b"\xff" + payload
        elif kind == "other message":
            payload = b"\x0a\x05hello\x10\xff\xff\xff\xff\x0f\x1a\x00\xff\xff"
        else:
            payload = b"\x0a\x80\x80\x04short"  # a length that runs past the end
        return Call(service, method, payload, token=service == "gs" and draw(st.booleans()),
                    typed=False, note=kind)

    return st.one_of(typed(), typed(), typed(), raw())


def oversize_calls() -> list[Call]:
    big = global_scheduler_pb2.GetKernelStatusRequest(kernel_id="x" * OVERSIZE)
    return [Call("gs", "GetKernelStatus", big.SerializeToString(), note="oversize"),
            Call("ls", "GetHostStatus", b"\x0a" + b"\xff" * OVERSIZE, typed=False,
                 note="oversize")]


@dataclass
class Tally:
    """What a campaign sent and got back."""

    codes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def tried(self) -> int:
        return sum(self.codes.values())


def send(channel: grpc.Channel, service: str, call: Call, token_metadata: tuple,
         timeout: float = 10.0) -> grpc.StatusCode:
    name = "GlobalScheduler" if service == "gs" else "LocalScheduler"
    method = channel.unary_unary(f"/notebookos.v1.{name}/{call.method}",
                                 request_serializer=None, response_deserializer=None)
    try:
        method(call.payload, timeout=timeout, metadata=token_metadata if call.token else None)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def judge(call: Call, code: grpc.StatusCode) -> str | None:
    """Why an answer is wrong, or None. Every answer is a status with a meaning: never UNKNOWN
    (a handler raised), never a deadline (a hang), never INTERNAL for a request that parses, and
    a Local Scheduler's method on the Global Scheduler without the token is UNAUTHENTICATED."""
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE):
        return f"{call!r} -> {code.name}"
    if call.typed and code == grpc.StatusCode.INTERNAL:
        return f"{call!r} -> INTERNAL for a well-formed request"
    if call.service == "gs" and call.method in HOST_METHODS and not call.token \
            and code != grpc.StatusCode.UNAUTHENTICATED:
        return f"{call!r} -> {code.name}, not UNAUTHENTICATED, without the join token"
    if call.note == "oversize" and code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"{call!r} -> {code.name}, not RESOURCE_EXHAUSTED"
    return None


# -- Jupyter messages for a kernel's front ---------------------------------------------------

DELIM = b"<IDS|MSG>"
KNOWN_REQUESTS = frozenset({
    "execute_request", "inspect_request", "complete_request", "history_request",
    "is_complete_request", "comm_info_request", "kernel_info_request", "shutdown_request",
    "interrupt_request", "debug_request", "input_reply", "comm_open", "comm_msg", "comm_close",
    "usage_request"})


def sign(key: bytes, parts: list[bytes]) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.hexdigest().encode()


@dataclass(frozen=True)
class ZmqInput:
    channel: str  # shell, control, stdin, hb, iopub
    frames: list[bytes]
    must_drop: bool  # not signed with the kernel's key (or not a message): counted as dropped
    note: str = ""

    def __repr__(self) -> str:
        sizes = [len(f) for f in self.frames]
        return f"ZmqInput({self.channel}, frames={sizes}, {self.note})"


def _json_frame() -> st.SearchStrategy[bytes]:
    values = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=20),
                  st.floats(allow_nan=False, allow_infinity=False)),
        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                st.dictionaries(st.text(max_size=10), inner, max_size=3)),
        max_leaves=8)
    return st.one_of(values.map(lambda v: json.dumps(v).encode()),
                     st.sampled_from([b"", b"{", b"\xff\xfe", b"[]" * 5, b'{"a": NaN}']))


def zmq_inputs(key: bytes, oversize: int = 4 * 1024 * 1024) -> st.SearchStrategy[ZmqInput]:
    """Bad or odd input for a front's sockets (``key``: the kernel's key): garbage frames,
    truncated messages, wrong, empty or other-key signatures (``must_drop``), correctly signed
    messages with odd headers and contents whose msg_type no kernel knows (never a request a
    kernel runs), heartbeat and IOPub subscription garbage, an oversize message."""
    channel = st.sampled_from(["shell", "control", "stdin"])
    header = st.fixed_dictionaries({}, optional={
        "msg_id": HOSTILE_TEXT, "session": HOSTILE_TEXT, "username": st.text(max_size=5),
        "version": st.sampled_from(["5.3", "", "99"]), "date": st.text(max_size=10),
        "msg_type": HOSTILE_TEXT.filter(lambda t: t not in KNOWN_REQUESTS)})

    @st.composite
    def garbage(draw: st.DrawFn) -> ZmqInput:
        frames = draw(st.lists(st.binary(max_size=64), min_size=1, max_size=7))
        if draw(st.booleans()):
            frames = [DELIM, *frames]
        return ZmqInput(draw(channel), frames, True, "garbage")

    @st.composite
    def forged(draw: st.DrawFn) -> ZmqInput:
        parts = [json.dumps(draw(header)).encode(), b"{}", b"{}",
                 json.dumps({"code": "raise SystemExit"}).encode()]
        parts[0] = parts[0].replace(b'"msg_type"', b'"_"') if draw(st.booleans()) else parts[0]
        kind = draw(st.sampled_from(["empty", "other key", "random", "truncated"]))
        if kind == "empty":
            sig = b""
        elif kind == "other key":
            sig = sign(b"not-the-kernel-key", parts)
        elif kind == "random":
            sig = draw(st.binary(min_size=1, max_size=80))
        else:
            sig = sign(key, parts)
            parts = parts[:draw(st.integers(0, 3))]
        return ZmqInput(draw(channel), [DELIM, sig, *parts], True, f"signature {kind}")

    @st.composite
    def signed_odd(draw: st.DrawFn) -> ZmqInput:
        hdr = draw(st.one_of(header.map(lambda h: json.dumps(h).encode()), _json_frame()))
        if b"_request" in hdr or b"input_reply" in hdr or b"comm_" in hdr:
            hdr = b"[]"  # never something a kernel would run
        parts = [hdr, draw(_json_frame()), draw(_json_frame()), draw(_json_frame())]
        return ZmqInput(draw(channel), [DELIM, sign(key, parts), *parts], False, "signed odd")

    other = st.one_of(
        st.lists(st.binary(max_size=32), min_size=1, max_size=3).map(
            lambda f: ZmqInput("hb", f, False, "heartbeat garbage")),
        st.lists(st.binary(max_size=32), min_size=1, max_size=2).map(
            lambda f: ZmqInput("iopub", f, False, "subscription garbage")),
        st.just(ZmqInput("shell", [DELIM, b"0" * 64, b"\x00" * oversize, b"{}", b"{}", b"{}"],
                         True, "oversize")),
    )
    return st.one_of(garbage(), forged(), forged(), signed_odd(), other)


# -- what must not change ------------------------------------------------------------------------


def snapshot(gs: grpc.Channel, hosts: dict[str, grpc.Channel], kernel_id: str) -> dict:
    """Hosts, their GPU accounting (both schedulers' views), the kernel's replicas with their
    pids and its state: what bad input must leave exactly as it was."""
    from notebookos.proto import global_scheduler_pb2_grpc, local_scheduler_pb2_grpc

    stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(gs)
    status = stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(), timeout=10)
    kernel = stub.GetKernelStatus(global_scheduler_pb2.GetKernelStatusRequest(
        kernel_id=kernel_id), timeout=10)
    on_hosts = {}
    for host_id, channel in hosts.items():
        hs = local_scheduler_pb2_grpc.LocalSchedulerStub(channel).GetHostStatus(
            local_scheduler_pb2.GetHostStatusRequest(), timeout=10)
        on_hosts[host_id] = (hs.host.gpus_committed, hs.instance_id,
                             sorted((r.kernel_id, r.replica_id, r.pid) for r in hs.replicas))
    return {
        "hosts": sorted((h.host_id, h.address, h.capacity.gpus, h.gpus_committed, h.draining)
                        for h in status.hosts),
        "kernels": [k.kernel_id for k in status.kernels],
        "replicas": sorted((r.replica_id, r.host_id, r.pid) for r in kernel.replicas),
        "state": kernel.state,
        "on_hosts": on_hosts,
    }


def settled(gs: grpc.Channel, hosts: dict[str, grpc.Channel], kernel_id: str,
            timeout: float = 10) -> dict:
    """``snapshot`` once the kernel is idle and no host holds a GPU (a cell's GPUs are released
    just after its reply)."""
    from notebookos.proto import common_pb2

    deadline = time.monotonic() + timeout
    while True:
        snap = snapshot(gs, hosts, kernel_id)
        idle = snap["state"] == common_pb2.KERNEL_STATE_IDLE and \
            all(h[0] == 0 for h in snap["on_hosts"].values())
        if idle or time.monotonic() > deadline:
            return snap
        time.sleep(0.2)
