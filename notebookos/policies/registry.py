"""Policies by name, found through the ``notebookos.policies`` entry-point group.

Any installed distribution can add a policy without touching NotebookOS, the way
jupyter_client finds kernel provisioners::

    # the plug-in's pyproject.toml
    [project.entry-points."notebookos.policies"]
    gandiva = "my_package.gandiva:GandivaPolicy"

The built-in policies register the same way (NotebookOS's own ``pyproject.toml``); ``BUILTIN``
below mirrors that table (tests/test_policies.py checks they agree) and is used only when the
installed metadata predates the group (an editable install made before it existed), with a
warning to reinstall. An entry point must load a ``Policy`` subclass whose ``name`` is the entry
point's name; one that fails to load is reported when it is asked for, and listed as broken.
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from notebookos.policies.base import Policy, PolicyKind

log = logging.getLogger(__name__)

GROUP = "notebookos.policies"
DEFAULT_POLICY = "notebookos"

# name -> "module:Class", exactly as in pyproject.toml's [project.entry-points."notebookos.policies"].
BUILTIN: dict[str, str] = {
    "notebookos": "notebookos.policies.notebookos_policy:NotebookOSPolicy",
    "reservation": "notebookos.policies.reservation:ReservationPolicy",
    "batch": "notebookos.policies.batch:BatchPolicy",
    "lcp": "notebookos.policies.lcp:LCPPolicy",
    "fifo": "notebookos.policies.fifo:FIFOPolicy",
    "sjf": "notebookos.policies.sjf:SJFPolicy",
    "srtf": "notebookos.policies.srtf:SRTFPolicy",
    "tiresias": "notebookos.policies.tiresias:TiresiasPolicy",
    "qssf": "notebookos.policies.qssf:QSSFPolicy",
    "ces": "notebookos.policies.ces:CESPolicy",
    "lucid": "notebookos.policies.lucid:LucidPolicy",
    "tensorshare": "notebookos.policies.tensorshare:TensorSharePolicy",
    "themis": "notebookos.policies.themis:ThemisPolicy",
    "gavel-ftf": "notebookos.policies.gavel_ftf:GavelFTF",
}

_cache: dict[str, type[Policy]] = {}
_broken: dict[str, str] = {}
_entries: dict[str, str] | None = None


def _discover() -> dict[str, str]:
    """Entry-point name -> target, from the installed metadata (once per process)."""
    global _entries
    if _entries is None:
        found: dict[str, str] = {ep.name: ep.value for ep in entry_points(group=GROUP)}
        missing = sorted(set(BUILTIN) - set(found))
        if missing:
            log.warning("the installed NotebookOS metadata lacks the built-in policies %s in the "
                        "%r entry-point group (reinstall: pip install -e .); using the built-in "
                        "table for them", missing, GROUP)
            for name in missing:
                found[name] = BUILTIN[name]
        _entries = found
    return _entries


def refresh() -> None:
    """Forget what was discovered (after installing a plug-in in a running process)."""
    global _entries
    _entries = None
    _cache.clear()
    _broken.clear()


def _load(name: str) -> type[Policy]:
    if name in _cache:
        return _cache[name]
    target = _discover()[name]
    try:
        cls = EntryPoint(name, target, GROUP).load()
    except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the others
        _broken[name] = f"{target}: {type(exc).__name__}: {exc}"
        raise ValueError(f"policy {name!r} is installed but cannot be loaded "
                         f"({_broken[name]})") from None
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ValueError(f"policy {name!r} ({target}) is not a notebookos.policies.Policy subclass")
    if cls.name != name:
        raise ValueError(f"policy {name!r} ({target}) calls itself {cls.name!r}: the entry-point "
                         "name and the class's `name` must agree")
    _cache[name] = cls
    return cls


def _loadable() -> dict[str, type[Policy]]:
    classes = {}
    for name in _discover():
        try:
            classes[name] = _load(name)
        except ValueError:
            continue
    return classes


def policy_names(kind: PolicyKind | None = None) -> list[str]:
    """Installed policy names (of one kind when ``kind`` is given), in a stable order: the
    default first, then session policies, then job policies, each alphabetically."""
    classes = _loadable()
    order = {PolicyKind.SESSION: 0, PolicyKind.JOB: 1}
    names = sorted(classes, key=lambda n: (n != DEFAULT_POLICY, order.get(classes[n].kind, 2), n))
    return [n for n in names if kind is None or classes[n].kind is kind]


def broken_policies() -> dict[str, str]:
    """Entry points that failed to load, with the reason."""
    _loadable()
    return dict(_broken)


def policy_class(name: str) -> type[Policy]:
    if name not in _discover():
        raise ValueError(
            f"unknown policy {name!r}; installed policies: {', '.join(policy_names())} (a plug-in "
            f"adds one through the {GROUP!r} entry-point group)"
        )
    return _load(name)


def get_policy(name: str, **params: Any) -> Policy:
    """A fresh policy object. Unknown names and bad parameters raise ValueError saying why."""
    cls = policy_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for policy {name!r}: {exc}") from None


__all__ = ["BUILTIN", "DEFAULT_POLICY", "GROUP", "broken_policies", "get_policy", "policy_class",
           "policy_names", "refresh"]
