"""Indexed host queries for policies: never a scan over every host.

Both walk ``Cluster.hosts_by_idle_gpus`` lazily and stop after ``limit`` hosts, so a placement
costs O(distinct idle counts + limit) whatever the cluster size. They only read, and the caller
must not change the cluster while it iterates (policies never do: they return decisions).
"""

from __future__ import annotations

from collections.abc import Iterator

from notebookos.cluster import Cluster, Host


def most_idle_first(cluster: Cluster, min_idle: int = 0, limit: int | None = None) -> Iterator[Host]:
    """Hosts with at least ``min_idle`` idle GPUs, most idle first, at most ``limit`` of them."""
    return cluster.hosts_by_idle_gpus(min_idle, limit=limit)


def fewest_idle_first(cluster: Cluster, min_idle: int = 0, limit: int | None = None) -> Iterator[Host]:
    """Hosts with at least ``min_idle`` idle GPUs, fewest idle first (best fit)."""
    return cluster.hosts_by_idle_gpus(min_idle, ascending=True, limit=limit)
