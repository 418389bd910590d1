"""The policy parameters a configuration gives: the one mapping from ``notebookos.config`` to a
policy's constructor, used by the live Global Scheduler (``global_scheduler/daemon.py``) and by
``notebookos replay``'s simulation of the same cluster (``notebookos/replay/compare.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notebookos.config import Config


def policy_params(config: Config) -> dict[str, Any]:
    """Constructor parameters of ``config.cluster.policy`` as ``config`` sets them."""
    name = config.cluster.policy
    gs = config.global_scheduler
    params: dict[str, Any] = {"scale_factor": gs.scaling_factor,
                              "buffer_hosts": gs.scaling_buffer_hosts, "min_hosts": gs.min_hosts}
    if name == "lcp":
        params["warm_containers_per_host"] = gs.warm_containers_per_host
    if name == "notebookos":
        ratio = config.cluster.max_subscription_ratio
        params["scale_in"] = gs.scale_in
        params["max_subscription_ratio"] = max(1.0, ratio)
        if ratio < 1.0:
            params["subscription_ratio_limit"] = ratio
    return params
