"""Conversions between the core's Python types and the ``notebookos.v1`` protobuf messages.

Bad values never pass silently: converting a message into a ``ResourceSpec`` runs the
``ResourceSpec`` validation and raises its ``InvalidResourceSpec`` (a ``ValueError``), with the
field path prefixed when ``where`` is given, so a servicer can answer ``INVALID_ARGUMENT`` with
``str(exc)``. Values too large for the wire types raise the same error on the way out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from notebookos.proto import common_pb2
from notebookos.resources import InvalidResourceSpec, ResourceSpec

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

CONNECTION_PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def resource_spec_to_proto(spec: ResourceSpec) -> common_pb2.ResourceSpec:
    """The wire form of ``spec``. Raises InvalidResourceSpec when a value exceeds its wire type."""
    if not isinstance(spec, ResourceSpec):
        raise TypeError(f"expected a ResourceSpec, got {type(spec).__name__}")
    limits = {"millicpus": INT64_MAX, "memory_mb": INT64_MAX, "gpus": INT32_MAX}
    for name, limit in limits.items():
        value = getattr(spec, name)
        if value > limit:
            raise InvalidResourceSpec(
                f"resource {name}={value} is not allowed: larger than the protocol's limit {limit}"
            )
    return common_pb2.ResourceSpec(
        millicpus=spec.millicpus, memory_mb=spec.memory_mb, gpus=spec.gpus, vram_gb=spec.vram_gb
    )


def resource_spec_from_proto(
    message: common_pb2.ResourceSpec, where: str = ""
) -> ResourceSpec:
    """A validated ``ResourceSpec`` from its wire form.

    ``where`` names the field for error messages, e.g. ``"StartKernelRequest.resources"``.
    An unset message field reads as all zeros (proto3), which is a valid, empty request.
    """
    if not isinstance(message, common_pb2.ResourceSpec):
        raise TypeError(f"expected a notebookos.v1.ResourceSpec, got {type(message).__name__}")
    try:
        return ResourceSpec(
            millicpus=message.millicpus,
            memory_mb=message.memory_mb,
            gpus=message.gpus,
            vram_gb=message.vram_gb,
        )
    except InvalidResourceSpec as exc:
        if not where:
            raise
        raise InvalidResourceSpec(f"{where}: {exc}") from exc


def connection_info_to_dict(message: common_pb2.ConnectionInfo) -> dict[str, Any]:
    """A Jupyter connection-info dict (the keys of a kernel connection file) from the message.

    ``key`` is returned as bytes, as jupyter_client's provisioners hand it over.
    """
    info: dict[str, Any] = {
        "ip": message.ip,
        "transport": message.transport,
        "signature_scheme": message.signature_scheme,
        "key": message.key.encode(),
    }
    for name in CONNECTION_PORT_NAMES:
        info[name] = getattr(message, name)
    return info


def connection_info_from_dict(info: Mapping[str, Any]) -> common_pb2.ConnectionInfo:
    """The message from a Jupyter connection-info dict; ``key`` may be bytes or str.

    Raises ValueError naming the key when a port is missing or not a port number.
    """
    ports = {}
    for name in CONNECTION_PORT_NAMES:
        value = info.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            raise ValueError(f"connection info {name}={value!r} is not a port number (1-65535)")
        ports[name] = value
    key = info.get("key", b"")
    if isinstance(key, bytes):
        key = key.decode()
    return common_pb2.ConnectionInfo(
        ip=str(info.get("ip", "127.0.0.1")),
        transport=str(info.get("transport", "tcp")),
        key=str(key),
        signature_scheme=str(info.get("signature_scheme", "hmac-sha256")),
        **ports,
    )
