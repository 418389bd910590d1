"""Scale-in: which hosts the autoscaler may give back, and in which order (issue 35).

One decision for the live autoscaler (global_scheduler/autoscaler.py ``tick``) and the simulator
(simulator/sessionsim.py ``_autoscale``): both call ``releasable_hosts`` on their ``Cluster`` with
the hosts they keep (``keep``) and take the first hosts of its answer. Pure, as every policy: no
clock, no I/O; what the caller does with a host it picks (drain it, give it to the provider) and
*when* it looks (the simulator's drain hysteresis) stay the caller's.

Which hosts (``scale_in``, the policy's ``scale_in``; see ``effective_mode``):

- ``empty``: hosts holding nothing: no replica subscribed, no GPU committed or reserved
  (``Host.is_empty``);
- ``idle``: hosts with no GPU committed or pending; the replicas they hold move off first;
- ``drain``: as ``idle`` (the simulator only looks above its hysteresis).

Order: fewest replicas first (an empty host first: nothing to move); ``drain`` orders the
prototype's way instead: fewest replicas that ran their kernel's last cell (moving one costs the
next cell its warm executor), then fewest subscribed GPUs. Ties: the newest host first (highest
``Cluster.registration``). Why newest first: the hosts ``notebookos up`` (or the operator) started
are the oldest, and they are the ones a provider often cannot or should not release (a static
pool, the local provider's own hosts): giving back the hosts the autoscaler added last keeps the
cluster where it was before the burst, and a host still warm from a burst (prewarm pool, cached
images) is worth less than one holding long-lived state. The simulator broke ties by host id
before, oldest first; the live autoscaler newest first, so the live order is kept.

Cost: it reads the Cluster's indexes of empty and unbound hosts (kept in O(1) per change) and
looks at no more than ``limit`` candidates of each kind, those empty (or unbound) the longest; so
a scaling tick of the simulator's 90-day traces with thousands of hosts costs O(limit log limit),
not O(hosts). With no more than ``limit`` candidates (every live cluster so far) the order above
is exact over the whole cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from notebookos.cluster import Cluster, Host

SCALE_IN = ("empty", "idle", "drain")
DEFAULT_LIMIT = 64  # as ``Policy.candidate_limit``


def effective_mode(policy: object) -> str:
    """The scale-in mode the autoscaler applies for ``policy``: its ``scale_in``; but a policy
    that cannot migrate replicas releases only empty hosts (nothing can move off the others)."""
    mode = str(getattr(policy, "scale_in", "empty"))
    if mode not in SCALE_IN:
        raise ValueError(f"scale_in={mode!r} must be one of {', '.join(SCALE_IN)}")
    if not getattr(policy, "supports_migration", False):
        return "empty"
    return mode


def last_executors(cluster: Cluster, host: Host) -> int:
    """Replicas on ``host`` that ran their kernel's last cell (its current executor)."""
    count = 0
    for owner in host.owners:
        kernel_id, _, rid = owner.rpartition("/")
        kernel = cluster.kernels.get(kernel_id)
        count += kernel is not None and str(kernel.executor) == rid
    return count


def _window(hosts: Iterable[Host], keep: Callable[[str], bool], limit: int,
            skip_empty: bool = False) -> Iterator[Host]:
    taken = 0
    for host in hosts:
        if taken >= limit:
            return
        if (skip_empty and host.is_empty) or keep(host.host_id):
            continue
        taken += 1
        yield host


def releasable_hosts(cluster: Cluster, scale_in: str, *,
                     keep: Callable[[str], bool] = lambda host_id: False,
                     limit: int | None = DEFAULT_LIMIT) -> list[str]:
    """The hosts scale-in may release under ``scale_in`` (see the module), in release order;
    ``keep(host_id)`` vetoes a host the caller holds on to (draining already, reserved for a
    waiting kernel, one the provider cannot release). At most ``limit`` empty hosts and ``limit``
    hosts holding replicas are looked at (``None``: all)."""
    if scale_in not in SCALE_IN:
        raise ValueError(f"scale_in={scale_in!r} must be one of {', '.join(SCALE_IN)}")
    bound = len(cluster.hosts) if limit is None else limit
    newest = cluster.registration
    empty = sorted(_window(cluster.empty_hosts(), keep, bound), key=lambda h: -newest(h.host_id))
    found = [h.host_id for h in empty]
    if scale_in == "empty":
        return found
    held = list(_window(cluster.unbound_hosts(), keep, bound, skip_empty=True))
    if scale_in == "drain":
        held.sort(key=lambda h: (last_executors(cluster, h), h.subscribed.gpus,
                                 -newest(h.host_id)))
    else:
        held.sort(key=lambda h: (len(h.owners), -newest(h.host_id)))
    return found + [h.host_id for h in held]


__all__ = ["DEFAULT_LIMIT", "SCALE_IN", "effective_mode", "last_executors", "releasable_hosts"]
