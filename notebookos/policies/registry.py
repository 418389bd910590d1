"""Policies by name: ``get_policy(name, **params)`` and ``policy_names()``."""

from __future__ import annotations

from typing import Any

from notebookos.policies.base import Policy, PolicyKind
from notebookos.policies.batch import BatchPolicy
from notebookos.policies.fifo import FIFOPolicy
from notebookos.policies.lcp import LCPPolicy
from notebookos.policies.notebookos_policy import NotebookOSPolicy
from notebookos.policies.reservation import ReservationPolicy
from notebookos.policies.sjf import SJFPolicy
from notebookos.policies.srtf import SRTFPolicy
from notebookos.policies.tiresias import TiresiasPolicy

DEFAULT_POLICY = "notebookos"

_POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        NotebookOSPolicy, ReservationPolicy, BatchPolicy, LCPPolicy,
        FIFOPolicy, SJFPolicy, SRTFPolicy, TiresiasPolicy,
    )
}


def policy_names(kind: PolicyKind | None = None) -> list[str]:
    """Known policy names (of one kind when ``kind`` is given), in a stable order."""
    return [n for n, c in _POLICIES.items() if kind is None or c.kind is kind]


def policy_class(name: str) -> type[Policy]:
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; known policies: {', '.join(policy_names())}"
        ) from None


def get_policy(name: str, **params: Any) -> Policy:
    """A fresh policy object. Unknown names and bad parameters raise ValueError saying why."""
    cls = policy_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for policy {name!r}: {exc}") from None
