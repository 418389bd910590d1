"""A scheduling profile: which plug-in runs each extension point, each with its configuration.

As in the Kubernetes scheduling framework, a profile names a plug-in per point; the live Global
Scheduler and the simulator run the same profile through one cycle
(``notebookos.policies.cycle.run_cycle``). Each plug-in is found through an entry-point group and
built with its own configuration section (keyword arguments), the way jupyter_client's
provisioner factory hands a provisioner its kernelspec's ``kernel_provisioner.config`` stanza:

| point | profile key | entry-point group | built-in plug-ins |
|---|---|---|---|
| queue sort | ``queue_sort`` | ``notebookos.queue_sort`` | ``arrival``, ``themis``, ``qssf`` (``cell_order``) |
| filter / score | ``policy`` | ``notebookos.policies`` | every policy (``registry``) |
| reserve / unreserve | ``reserve`` | (the policy's ``binding``) | ``policy`` |
| post-filter | ``post_filter`` (a list, tried in order) | ``notebookos.post_filter`` | ``share``, ``migrate`` (``cycle``) |
| scale | ``scale`` | ``notebookos.scale`` | ``policy`` (the policy's own ``scaling``), ``ces`` (``ForecastScaling``) |

A profile is written as a mapping (``Profile.load``)::

    {"policy": "notebookos", "queue_sort": "themis", "post_filter": ["share", "migrate"],
     "scale": "policy",
     "config": {"policy": {"scale_factor": 1.1}, "queue_sort": {"half_life_s": 300},
                "post_filter": {"share": {"predictor": "knn"}}}}

``config`` holds the section of the plug-in each point names (``post_filter``: one per plug-in,
by name); a plug-in without one gets no arguments. A third-party plug-in registers under the
group and is named in a profile like a built-in one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from notebookos.policies.base import Policy
from notebookos.policies.cell_order import CellOrder
from notebookos.policies.cycle import PostFilter, SharePostFilter
from notebookos.policies.gpu_sharing import GpuSharing
from notebookos.policies.registry import get_policy

if TYPE_CHECKING:
    from notebookos.config import Config

log = logging.getLogger(__name__)

QUEUE_SORT = "notebookos.queue_sort"
POST_FILTER = "notebookos.post_filter"
SCALE = "notebookos.scale"

# group -> name -> "module:Class", exactly as in pyproject.toml's entry points (the fallback when
# the installed metadata predates a group, as registry.BUILTIN).
BUILTIN: dict[str, dict[str, str]] = {
    QUEUE_SORT: {"arrival": "notebookos.policies.cell_order:ArrivalOrder",
                 "themis": "notebookos.policies.cell_order:UserFairness",
                 "qssf": "notebookos.policies.cell_order:PredictedShortestFirst"},
    POST_FILTER: {"migrate": "notebookos.policies.cycle:MigratePostFilter",
                  "share": "notebookos.policies.cycle:SharePostFilter"},
    SCALE: {"policy": "notebookos.policies.profile:PolicyScaling",
            "ces": "notebookos.policies.forecast_scaling:ForecastScaling"},
}


class PolicyScaling:
    """The scale plug-in ``policy``: the policy's own ``scaling`` (committed GPUs x
    scale_factor plus a buffer, paper 3.4.2); the autoscaler calls the policy."""

    name = "policy"


def plugin_names(group: str) -> list[str]:
    found = {ep.name for ep in entry_points(group=group)}
    return sorted(found | set(BUILTIN.get(group, {})))


def load_plugin(group: str, name: str, section: Mapping[str, Any] | None = None) -> Any:
    """The plug-in ``name`` of ``group``, built with its configuration section."""
    found = {ep.name: ep.value for ep in entry_points(group=group)}
    target = found.get(name) or BUILTIN.get(group, {}).get(name)
    if target is None:
        raise ValueError(f"unknown {group} plug-in {name!r}; installed: "
                         f"{', '.join(plugin_names(group))}")
    try:
        factory = EntryPoint(name, target, group).load()
    except Exception as exc:  # noqa: BLE001 - report which plug-in is broken
        raise ValueError(f"{group} plug-in {name!r} ({target}) cannot be loaded: "
                         f"{type(exc).__name__}: {exc}") from None
    try:
        return factory(**dict(section or {}))
    except TypeError as exc:
        raise ValueError(f"bad configuration for {group} plug-in {name!r}: {exc}") from None


@dataclass
class Profile:
    """The plug-ins of one scheduling profile (build with ``load``, ``for_policy`` or
    ``from_config``)."""

    policy: Policy
    queue_sort: CellOrder | None = None
    post_filters: tuple[PostFilter, ...] = ()
    scale: Any = None
    names: dict[str, Any] = field(default_factory=dict)

    @property
    def sharing(self) -> GpuSharing | None:
        """The share post-filter's sharing decision, when the profile shares GPUs."""
        for plugin in self.post_filters:
            if isinstance(plugin, SharePostFilter):
                return plugin.sharing
        return None

    @property
    def shares(self) -> bool:
        return any(isinstance(p, SharePostFilter) for p in self.post_filters)

    @classmethod
    def load(cls, spec: Mapping[str, Any]) -> Profile:
        config: Mapping[str, Any] = spec.get("config", {}) or {}
        unknown_sections = set(config) - {"policy", "queue_sort", "post_filter", "scale"}
        if unknown_sections:
            raise ValueError(f"unknown profile config sections {sorted(unknown_sections)}")
        post_config: Mapping[str, Mapping[str, Any]] = config.get("post_filter", {}) or {}
        unknown = set(spec) - {"policy", "queue_sort", "post_filter", "scale", "reserve", "config"}
        if unknown:
            raise ValueError(f"unknown profile keys {sorted(unknown)}")
        policy_name = spec.get("policy", "notebookos")
        policy = get_policy(policy_name, **dict(config.get("policy", {})))
        reserve = spec.get("reserve", "policy")
        if reserve != "policy":
            raise ValueError(f"reserve plug-in {reserve!r}: only `policy` (the policy's own "
                             "binding strategy) is supported")
        queue_sort = spec.get("queue_sort", "arrival")
        post = spec.get("post_filter", ["migrate"])
        if isinstance(post, str):
            post = [post]
        scale = spec.get("scale", "policy")
        post_filters = tuple(load_plugin(POST_FILTER, n, post_config.get(n)) for n in post)
        for name, plugin in zip(post, post_filters, strict=True):
            if not isinstance(plugin, PostFilter):
                raise ValueError(f"post-filter plug-in {name!r} is not a "
                                 "notebookos.policies.cycle.PostFilter")
        order = load_plugin(QUEUE_SORT, queue_sort, config.get("queue_sort"))
        if not isinstance(order, CellOrder):
            raise ValueError(f"queue-sort plug-in {queue_sort!r} is not a CellOrder")
        return cls(policy, order, post_filters, load_plugin(SCALE, scale, config.get("scale")),
                   {"policy": policy_name, "queue_sort": queue_sort, "post_filter": list(post),
                    "scale": scale, "reserve": reserve})

    @classmethod
    def for_policy(cls, policy: Policy, *, sharing: GpuSharing | None = None,
                   queue_sort: CellOrder | None = None) -> Profile:
        """The profile of an already built policy: its own filter/score, reserve and scaling;
        post-filter ``share`` (with ``sharing``, when given) then ``migrate``."""
        post: tuple[PostFilter, ...] = (
            (SharePostFilter(sharing=sharing),) if sharing is not None else ()) + (
            load_plugin(POST_FILTER, "migrate"),)
        return cls(policy, queue_sort, post, PolicyScaling(),
                   {"policy": policy.name, "queue_sort": getattr(queue_sort, "name", None),
                    "post_filter": [p.name for p in post], "scale": "policy",
                    "reserve": "policy"})


def profile_spec(config: Config, *, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The profile ``config``'s settings describe (the policy's section from ``policy_params``;
    ``extra`` adds or replaces sections, as ``config`` in ``Profile.load``)."""
    from notebookos.policies.live import policy_params

    gs = config.global_scheduler
    post = ["share", "migrate"] if gs.gpu_sharing == "tensorshare" else ["migrate"]
    sections: dict[str, Any] = {"policy": policy_params(config), "post_filter": {}}
    if "share" in post:
        sections["post_filter"]["share"] = {"predictor": gs.gpu_sharing_predictor}
    if gs.scaling == "ces":
        sections["scale"] = {"check_interval_s": gs.ces_check_interval_s, "day_s": gs.ces_day_s,
                             "wake_buffer": gs.scaling_buffer_hosts, "min_hosts": gs.min_hosts}
    configured = json.loads(gs.plugin_config) if gs.plugin_config else {}
    for key, section in [*configured.items(), *(extra or {}).items()]:
        if key == "post_filter":
            sections["post_filter"].update({k: dict(v) for k, v in section.items()})
        else:
            sections[key] = {**sections.get(key, {}), **section}
    return {"policy": config.cluster.policy, "queue_sort": gs.cell_order, "post_filter": post,
            "scale": gs.scaling, "config": sections}


def profile_from_config(config: Config) -> Profile:
    return Profile.load(profile_spec(config))


__all__ = ["BUILTIN", "POST_FILTER", "QUEUE_SORT", "SCALE", "PolicyScaling", "Profile",
           "load_plugin", "plugin_names", "profile_from_config", "profile_spec"]
