"""Indexed host queries for policies: never a scan over every host.

``Cluster.hosts_by_idle_gpus`` copies each idle-count bucket before yielding from it, so asking it
for the first host of a bucket of 10,000 empty hosts costs 10,000 steps. These helpers walk the
cluster's buckets lazily and stop after ``limit`` hosts, so a placement costs
O(distinct idle counts + limit) whatever the cluster size. They only read, and the caller must not
change the cluster while it iterates (policies never do: they return decisions).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from notebookos.cluster import Cluster, Host


def _buckets(cluster: Cluster) -> dict[int, dict[str, Host]] | None:
    buckets = getattr(cluster, "_by_idle", None)
    return buckets if isinstance(buckets, dict) else None


def most_idle_first(cluster: Cluster, min_idle: int = 0, limit: int | None = None) -> Iterator[Host]:
    """Hosts with at least ``min_idle`` idle GPUs, most idle first, at most ``limit`` of them."""
    buckets = _buckets(cluster)
    if buckets is None:  # a cluster without the index: fall back to its public iterator
        yield from islice(cluster.hosts_by_idle_gpus(min_idle), limit)
        return
    left = limit
    for idle in sorted((k for k in buckets if k >= min_idle), reverse=True):
        for host in buckets[idle].values():
            if left is not None:
                if left == 0:
                    return
                left -= 1
            yield host


def fewest_idle_first(cluster: Cluster, min_idle: int = 0, limit: int | None = None) -> Iterator[Host]:
    """Hosts with at least ``min_idle`` idle GPUs, fewest idle first (best fit)."""
    buckets = _buckets(cluster)
    if buckets is None:
        hosts = sorted(cluster.hosts_by_idle_gpus(min_idle), key=lambda h: h.idle_gpus)
        yield from islice(hosts, limit)
        return
    left = limit
    for idle in sorted(k for k in buckets if k >= min_idle):
        for host in buckets[idle].values():
            if left is not None:
                if left == 0:
                    return
                left -= 1
            yield host
