"""The cluster model: hosts and their resource accounting, kernels and their replicas.

Accounting follows DESIGN section 5. On each host:

- *subscribed*: the sum of the requests of the replicas placed on it. Hosts are oversubscribed on
  purpose, so this may exceed the capacity, up to ``capacity x oversubscription``.
- *pending*: resources set aside for a replica that is about to execute (a migration target or an
  execute request in flight) but not yet bound.
- *committed*: resources bound to a replica while it executes a cell, with concrete GPU device ids.

``pending + committed`` never exceeds the capacity. Every operation either succeeds completely or
raises ``AccountingError`` saying why and leaves the host exactly as it was. Every resource
holder is identified by an *owner* string (for example ``"<kernel id>/<replica id>"``); an owner
holds at most one subscription, one reservation and one commitment per host.

``Cluster`` keeps hosts in an index by idle GPU count, so a policy can ask for the hosts with the
most idle GPUs without scanning every host (the simulator runs 10,000 hosts); and, for the
scale-in (``policies/scale_in.py``), the hosts with no GPU bound and the hosts holding nothing,
each in the order they became so, and each host's registration number (newest = highest).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from notebookos.resources import ZERO, ResourceSpec

DEFAULT_REPLICAS_PER_KERNEL = 3
# Hard cap on a host's subscriptions, as a multiple of its capacity. The notebookos policy's
# dynamic subscription-ratio limit goes up to 7, and SR = subscribed / (capacity x R), so the cap
# must be at least R x 7 for the policy, not the accounting, to be what limits placement.
DEFAULT_OVERSUBSCRIPTION = 21.0


class AccountingError(Exception):
    """A resource operation was refused; nothing changed. The message says why."""


class Host:
    """One GPU host (a Local Scheduler) and its resource accounting."""

    def __init__(
        self,
        host_id: str,
        capacity: ResourceSpec,
        *,
        address: str = "",
        gpu_device_ids: Sequence[int] | None = None,
        oversubscription: float = DEFAULT_OVERSUBSCRIPTION,
        virtual_gpus: bool = True,
    ) -> None:
        if not host_id:
            raise ValueError("host_id must be a non-empty string")
        if not isinstance(capacity, ResourceSpec):
            raise TypeError(f"capacity must be a ResourceSpec, not {type(capacity).__name__}")
        if not oversubscription >= 1.0:
            raise ValueError(f"oversubscription={oversubscription!r} is not allowed: must be >= 1")
        ids = tuple(range(capacity.gpus)) if gpu_device_ids is None else tuple(gpu_device_ids)
        if len(ids) != capacity.gpus or len(set(ids)) != len(ids) or any(i < 0 for i in ids):
            raise ValueError(
                f"host {host_id}: gpu_device_ids={list(ids)} must be {capacity.gpus} distinct "
                "non-negative ids (one per GPU)"
            )
        self.host_id = host_id
        self.address = address
        self.capacity = capacity
        self.gpu_device_ids: tuple[int, ...] = ids
        self.oversubscription = float(oversubscription)
        self.virtual_gpus = virtual_gpus
        self.subscribed: ResourceSpec = ZERO
        self.pending: ResourceSpec = ZERO
        self.committed: ResourceSpec = ZERO
        self._subscriptions: dict[str, ResourceSpec] = {}
        self._reservations: dict[str, ResourceSpec] = {}
        self._commitments: dict[str, tuple[ResourceSpec, tuple[int, ...]]] = {}
        self._free_device_ids: list[int] = list(ids)
        self._on_change: Callable[[Host, int], None] | None = None

    # -- derived figures --------------------------------------------------------------------

    @property
    def idle_gpus(self) -> int:
        """GPUs neither committed nor reserved."""
        return self.capacity.gpus - self.committed.gpus - self.pending.gpus

    @property
    def available(self) -> ResourceSpec:
        """Capacity not committed or reserved."""
        return self.capacity - self.committed - self.pending

    @property
    def subscription_limit(self) -> ResourceSpec:
        c, f = self.capacity, self.oversubscription
        return ResourceSpec(
            int(c.millicpus * f), int(c.memory_mb * f), int(c.gpus * f), c.vram_gb * f
        )

    def subscription_ratio(self, replicas_per_kernel: int = DEFAULT_REPLICAS_PER_KERNEL) -> float:
        """SR = subscribed GPUs / (host GPUs x R); 0 for a host without GPUs."""
        if self.capacity.gpus == 0:
            return 0.0
        return self.subscribed.gpus / (self.capacity.gpus * replicas_per_kernel)

    def subscription_of(self, owner: str) -> ResourceSpec | None:
        return self._subscriptions.get(owner)

    def commitment_of(self, owner: str) -> tuple[int, ...] | None:
        held = self._commitments.get(owner)
        return None if held is None else held[1]

    def reservation_of(self, owner: str) -> ResourceSpec | None:
        return self._reservations.get(owner)

    @property
    def owners(self) -> frozenset[str]:
        return frozenset(self._subscriptions) | frozenset(self._reservations) | frozenset(
            self._commitments
        )

    def can_subscribe(self, spec: ResourceSpec) -> bool:
        return spec.fits_within(self.capacity) and (self.subscribed + spec).fits_within(
            self.subscription_limit
        )

    def can_commit(self, spec: ResourceSpec, owner: str | None = None) -> bool:
        """Whether ``spec`` could be committed now (counting ``owner``'s own reservation)."""
        cap, com, pen = self.capacity, self.committed, self.pending
        own = self._reservations.get(owner) if owner is not None else None
        if own is None:
            own = ZERO
        return (
            spec.gpus <= cap.gpus - com.gpus - pen.gpus + own.gpus
            and spec.millicpus <= cap.millicpus - com.millicpus - pen.millicpus + own.millicpus
            and spec.memory_mb <= cap.memory_mb - com.memory_mb - pen.memory_mb + own.memory_mb
            and spec.vram_gb <= cap.vram_gb - com.vram_gb - pen.vram_gb + own.vram_gb + 1e-9
        )

    @property
    def is_empty(self) -> bool:
        """Holds no subscription, reservation or commitment (cheap: no set is built)."""
        return not (self._subscriptions or self._reservations or self._commitments)

    # -- operations -------------------------------------------------------------------------

    def subscribe(self, owner: str, spec: ResourceSpec) -> None:
        """Place a replica's request on this host (oversubscription allowed up to the limit)."""
        if owner in self._subscriptions:
            raise AccountingError(f"host {self.host_id}: {owner} is already subscribed")
        if not spec.fits_within(self.capacity):
            raise AccountingError(
                f"host {self.host_id}: request ({spec}) can never fit: "
                + ", ".join(spec.shortfall(self.capacity))
            )
        new_total = self.subscribed + spec
        if not new_total.fits_within(self.subscription_limit):
            raise AccountingError(
                f"host {self.host_id}: subscribing {owner} would pass the subscription limit "
                f"(x{self.oversubscription:g}): " + ", ".join(new_total.shortfall(self.subscription_limit))
            )
        self._subscriptions[owner] = spec
        self.subscribed = new_total
        self._changed()

    def unsubscribe(self, owner: str) -> ResourceSpec:
        spec = self._subscriptions.get(owner)
        if spec is None:
            raise AccountingError(f"host {self.host_id}: {owner} is not subscribed")
        self.subscribed = self.subscribed - spec
        del self._subscriptions[owner]
        self._changed()
        return spec

    def reserve(self, owner: str, spec: ResourceSpec) -> None:
        """Set resources aside (pending) for an owner that is about to execute here."""
        if owner in self._reservations or owner in self._commitments:
            raise AccountingError(f"host {self.host_id}: {owner} already holds resources here")
        if not spec.fits_within(self.available):
            raise AccountingError(
                f"host {self.host_id}: cannot reserve for {owner}: "
                + ", ".join(spec.shortfall(self.available))
            )
        self._reservations[owner] = spec
        self.pending = self.pending + spec
        self._changed()

    def cancel_reservation(self, owner: str) -> ResourceSpec:
        spec = self._reservations.get(owner)
        if spec is None:
            raise AccountingError(f"host {self.host_id}: {owner} has no reservation")
        self.pending = self.pending - spec
        del self._reservations[owner]
        self._changed()
        return spec

    def commit(
        self, owner: str, spec: ResourceSpec, device_ids: Sequence[int] | None = None
    ) -> tuple[int, ...]:
        """Bind ``spec`` to ``owner``; returns the GPU device ids bound.

        A reservation held by ``owner`` is converted. ``device_ids`` picks specific free devices
        (restoring state after a restart); by default the lowest free ids are taken.
        """
        if owner in self._commitments:
            raise AccountingError(f"host {self.host_id}: {owner} already has committed resources")
        if not self.can_commit(spec, owner):
            room = self.available + self._reservations.get(owner, ZERO)
            raise AccountingError(
                f"host {self.host_id}: cannot commit for {owner}: " + ", ".join(spec.shortfall(room))
            )
        if device_ids is None:
            chosen = tuple(sorted(self._free_device_ids)[: spec.gpus])
        else:
            chosen = tuple(device_ids)
            if len(chosen) != spec.gpus or len(set(chosen)) != len(chosen):
                raise AccountingError(
                    f"host {self.host_id}: device ids {list(chosen)} do not match {spec.gpus} GPUs"
                )
            busy = [i for i in chosen if i not in self._free_device_ids]
            if busy:
                raise AccountingError(f"host {self.host_id}: GPU device ids {busy} are not free")
        reservation = self._reservations.pop(owner, None)
        if reservation is not None:
            self.pending = self.pending - reservation
        for i in chosen:
            self._free_device_ids.remove(i)
        self._commitments[owner] = (spec, chosen)
        self.committed = self.committed + spec
        self._changed()
        return chosen

    def release(self, owner: str) -> tuple[int, ...]:
        """Unbind what ``owner`` committed; returns the freed device ids."""
        held = self._commitments.get(owner)
        if held is None:
            raise AccountingError(f"host {self.host_id}: {owner} has nothing committed")
        spec, ids = held
        self.committed = self.committed - spec
        self._free_device_ids.extend(ids)
        del self._commitments[owner]
        self._changed()
        return ids

    def release_owner(self, owner: str) -> None:
        """Drop everything ``owner`` holds here (its replica died or left); never raises."""
        if owner in self._commitments:
            self.release(owner)
        if owner in self._reservations:
            self.cancel_reservation(owner)
        if owner in self._subscriptions:
            self.unsubscribe(owner)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self, self.idle_gpus)

    def to_dict(self, replicas_per_kernel: int = DEFAULT_REPLICAS_PER_KERNEL) -> dict:
        return {
            "id": self.host_id,
            "address": self.address,
            "gpus": {
                "total": self.capacity.gpus,
                "committed": self.committed.gpus,
                "pending": self.pending.gpus,
                "idle": self.idle_gpus,
                "subscribed": self.subscribed.gpus,
                "device_ids": list(self.gpu_device_ids),
                "virtual": self.virtual_gpus,
            },
            "capacity": self.capacity.to_dict(),
            "subscribed": self.subscribed.to_dict(),
            "committed": self.committed.to_dict(),
            "pending": self.pending.to_dict(),
            "subscription_ratio": round(self.subscription_ratio(replicas_per_kernel), 6),
        }

    def __repr__(self) -> str:
        return (
            f"Host({self.host_id!r}, gpus={self.capacity.gpus}, committed={self.committed.gpus}, "
            f"pending={self.pending.gpus}, subscribed={self.subscribed.gpus})"
        )


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    MIGRATING = "migrating"
    STOPPED = "stopped"
    DEAD = "dead"


@dataclass
class Replica:
    kernel_id: str
    replica_id: int
    host_id: str
    state: ReplicaState = ReplicaState.STARTING
    pid: int | None = None

    @property
    def owner(self) -> str:
        return replica_owner(self.kernel_id, self.replica_id)

    def to_dict(self) -> dict:
        return {
            "replica_id": self.replica_id,
            "host_id": self.host_id,
            "pid": self.pid,
            "state": str(self.state),
        }


def replica_owner(kernel_id: str, replica_id: int) -> str:
    """The owner string under which a replica holds resources on its host."""
    return f"{kernel_id}/{replica_id}"


@dataclass
class Kernel:
    kernel_id: str
    request: ResourceSpec
    replicas: dict[int, Replica] = field(default_factory=dict)
    executor: int | None = None

    def live_replicas(self) -> list[Replica]:
        return [
            r for r in self.replicas.values()
            if r.state in (ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.MIGRATING)
        ]

    def to_dict(self) -> dict:
        return {
            "id": self.kernel_id,
            "request": self.request.to_dict(),
            "replicas": [r.to_dict() for r in sorted(self.replicas.values(), key=lambda r: r.replica_id)],
            "executor": self.executor,
        }


class Cluster:
    """Hosts (indexed by idle GPUs) and kernels. Placement changes go through here."""

    def __init__(self, replicas_per_kernel: int = DEFAULT_REPLICAS_PER_KERNEL) -> None:
        self.replicas_per_kernel = replicas_per_kernel
        self.hosts: dict[str, Host] = {}
        self.kernels: dict[str, Kernel] = {}
        self._by_idle: dict[int, dict[str, Host]] = {}
        self._host_bucket: dict[str, int] = {}
        self.total_gpus = 0
        self.subscribed_gpus = 0
        self.committed_gpus = 0
        self._counted: dict[str, tuple[int, int]] = {}  # host -> (subscribed, committed) GPUs
        # The scale-in's indexes, kept in O(1) per host change: hosts with no GPU committed or
        # pending, and hosts holding nothing (``Host.is_empty``), each in the order they became
        # so; and each host's registration number.
        self._unbound: dict[str, Host] = {}
        self._empty: dict[str, Host] = {}
        self._registration: dict[str, int] = {}
        self._registrations = 0

    # -- hosts ------------------------------------------------------------------------------

    def add_host(self, host: Host) -> Host:
        if host.host_id in self.hosts:
            raise ValueError(f"host {host.host_id} is already registered")
        self.hosts[host.host_id] = host
        self._registration[host.host_id] = self._registrations
        self._registrations += 1
        self.total_gpus += host.capacity.gpus
        self._recount(host)
        host._on_change = self._host_changed
        self._index(host)
        return host

    def remove_host(self, host_id: str) -> Host:
        host = self.get_host(host_id)
        if not host.is_empty:
            raise AccountingError(
                f"host {host_id} still holds resources for {sorted(host.owners)}; move them first"
            )
        del self.hosts[host_id]
        del self._registration[host_id]
        self._unbound.pop(host_id, None)
        self._empty.pop(host_id, None)
        bucket = self._host_bucket.pop(host_id)
        del self._by_idle[bucket][host_id]
        if not self._by_idle[bucket]:
            del self._by_idle[bucket]
        self.total_gpus -= host.capacity.gpus
        self.subscribed_gpus -= self._counted[host_id][0]
        self.committed_gpus -= self._counted.pop(host_id)[1]
        host._on_change = None
        return host

    def get_host(self, host_id: str) -> Host:
        try:
            return self.hosts[host_id]
        except KeyError:
            raise KeyError(f"unknown host {host_id!r}") from None

    def hosts_by_idle_gpus(
        self, min_idle: int = 0, *, ascending: bool = False, limit: int | None = None
    ) -> Iterator[Host]:
        """Hosts with at least ``min_idle`` idle GPUs, most idle first (``ascending``: fewest
        first); ties in registration order; at most ``limit`` hosts.

        Costs O(distinct idle counts + hosts yielded), not O(all hosts): nothing is copied. The
        caller must not change the accounting of a host while iterating (collect, then act).
        """
        if limit is not None and limit <= 0:
            return
        given = 0
        for idle in sorted((k for k in self._by_idle if k >= min_idle), reverse=not ascending):
            for host in self._by_idle[idle].values():
                yield host
                given += 1
                if limit is not None and given >= limit:
                    return

    def registration(self, host_id: str) -> int:
        """The host's registration number: hosts registered later have higher ones (a host that
        registers again counts as new)."""
        return self._registration[host_id]

    def unbound_hosts(self) -> Iterator[Host]:
        """Hosts with no GPU committed or pending, those unbound the longest first. Lazy: costs
        the hosts taken, not the cluster's size (do not change accounting while iterating)."""
        return iter(self._unbound.values())

    def empty_hosts(self) -> Iterator[Host]:
        """Hosts holding nothing (no subscription, reservation or commitment), those empty the
        longest first. Lazy, as ``unbound_hosts``."""
        return iter(self._empty.values())

    def subscription_ratio(self) -> float:
        """Cluster-wide SR = subscribed GPUs / (all GPUs x R)."""
        if self.total_gpus == 0:
            return 0.0
        return self.subscribed_gpus / (self.total_gpus * self.replicas_per_kernel)

    def _index(self, host: Host) -> None:
        bucket = host.idle_gpus
        self._by_idle.setdefault(bucket, {})[host.host_id] = host
        self._host_bucket[host.host_id] = bucket
        self._index_scale_in(host)

    def _index_scale_in(self, host: Host) -> None:
        host_id = host.host_id
        if host.committed.gpus == 0 and host.pending.gpus == 0:
            if host_id not in self._unbound:
                self._unbound[host_id] = host
        else:
            self._unbound.pop(host_id, None)
        if host.is_empty:
            if host_id not in self._empty:
                self._empty[host_id] = host
        else:
            self._empty.pop(host_id, None)

    def _host_changed(self, host: Host, idle: int) -> None:
        old = self._host_bucket[host.host_id]
        if old != idle:
            del self._by_idle[old][host.host_id]
            if not self._by_idle[old]:
                del self._by_idle[old]
            self._index(host)
        else:
            self._index_scale_in(host)
        self._recount(host)

    def _recount(self, host: Host) -> None:
        """Keep the cluster-wide GPU totals exact in O(1) per host change."""
        prev_sub, prev_com = self._counted.get(host.host_id, (0, 0))
        self.subscribed_gpus += host.subscribed.gpus - prev_sub
        self.committed_gpus += host.committed.gpus - prev_com
        self._counted[host.host_id] = (host.subscribed.gpus, host.committed.gpus)

    # -- kernels ----------------------------------------------------------------------------

    def add_kernel(self, kernel_id: str, request: ResourceSpec) -> Kernel:
        if kernel_id in self.kernels:
            raise ValueError(f"kernel {kernel_id} already exists")
        kernel = Kernel(kernel_id, request)
        self.kernels[kernel_id] = kernel
        return kernel

    def get_kernel(self, kernel_id: str) -> Kernel:
        try:
            return self.kernels[kernel_id]
        except KeyError:
            raise KeyError(f"unknown kernel {kernel_id!r}") from None

    def place_replica(self, kernel_id: str, replica_id: int, host_id: str) -> Replica:
        """Subscribe the kernel's request on ``host_id`` for a new replica."""
        kernel = self.get_kernel(kernel_id)
        host = self.get_host(host_id)
        if replica_id in kernel.replicas and kernel.replicas[replica_id].state != ReplicaState.DEAD:
            raise AccountingError(f"kernel {kernel_id} already has a live replica {replica_id}")
        if any(r.host_id == host_id for r in kernel.live_replicas()):
            raise AccountingError(f"kernel {kernel_id} already has a replica on host {host_id}")
        replica = Replica(kernel_id, replica_id, host_id)
        host.subscribe(replica.owner, kernel.request)
        kernel.replicas[replica_id] = replica
        return replica

    def remove_replica(self, kernel_id: str, replica_id: int) -> Replica:
        """Release everything the replica holds and forget it."""
        kernel = self.get_kernel(kernel_id)
        replica = kernel.replicas.pop(replica_id, None)
        if replica is None:
            raise KeyError(f"kernel {kernel_id} has no replica {replica_id}")
        host = self.hosts.get(replica.host_id)
        if host is not None:
            host.release_owner(replica.owner)
        if kernel.executor == replica_id:
            kernel.executor = None
        return replica

    def remove_kernel(self, kernel_id: str) -> Kernel:
        kernel = self.get_kernel(kernel_id)
        for replica_id in list(kernel.replicas):
            self.remove_replica(kernel_id, replica_id)
        del self.kernels[kernel_id]
        return kernel

    def status(self) -> dict:
        """The status document (``notebookos status --json``): stable keys hosts/kernels."""
        return {
            "hosts": [h.to_dict(self.replicas_per_kernel) for h in self.hosts.values()],
            "kernels": [k.to_dict() for k in self.kernels.values()],
            "subscription_ratio": round(self.subscription_ratio(), 6),
        }
