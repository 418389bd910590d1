"""GPU sharing in the Global Scheduler (``global_scheduler.gpu_sharing = "tensorshare"``): when a
cell's GPUs cannot be committed exclusively on any of its replicas' hosts, it may join a device
one other kernel's cell holds, if ``notebookos.policies.gpu_sharing`` accepts the pair (both
gpu_sla, predicted slowdowns; never three). The decision is the scheduling cycle's share
post-filter (``notebookos.policies.cycle.SharePostFilter``, tried before ``migrate`` when the
profile names it): sharing moves nothing and, by the decision, keeps both cells within their
SLA, where a migration costs a replica start and catch-up on a cell the user waits for. This
mixin gives the cycle its device view (``_sharing_view``) and applies a share decision
(``_apply_share``).

Accounting: the cluster model holds one commitment per device (``Host.commit``), so the first
holder of a shared device is committed there as usual and the cell that joins it is kept here
(``_sharers``) until the first releases; then it takes the device over in the model. Mixed into
``GlobalSchedulerService`` through ``ExecutionMixin``; the lock is the service's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from notebookos.cluster import AccountingError, replica_owner
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.policies.cycle import CycleResult, ReplicaDevices, SharingView
from notebookos.policies.gpu_sharing import GpuSharing, SharingParty
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sharer:
    """A cell that joined devices another cell held when it was committed."""

    host_id: str
    replica_id: int
    device_ids: tuple[int, ...]


class SharingMixin:
    gpu_sharing: GpuSharing | None = None  # set by the daemon when gpu_sharing is on

    @property
    def _sharers(self) -> dict[tuple[str, str], Sharer]:
        """(kernel id, msg id) -> the cell that joined a held device."""
        return self.__dict__.setdefault("_gpu_sharers", {})

    def _may_share(self, entry: KernelEntry) -> bool:
        return self.gpu_sharing is not None and entry.hints.shares_gpus

    def _party(self, kernel_id: str) -> SharingParty:
        entry = self.kernels.get(kernel_id)
        kernel = self.cluster.kernels.get(kernel_id)
        if entry is None:
            return SharingParty(kernel_id)  # gone meanwhile: treated as never sharing
        vram = kernel.request.vram_gb if kernel is not None else 0.0
        return SharingParty(kernel_id, entry.hints.gpu_sla, entry.hints.gpu_workload, vram)

    def _live_sharers(self, host_id: str | None = None) -> dict[tuple[str, str], Sharer]:
        """Sharers whose cell still holds its GPUs (a cell whose kernel or replica went away is
        forgotten here). Lock held."""
        live = {}
        for (kernel_id, msg_id), sharer in list(self._sharers.items()):
            entry = self.kernels.get(kernel_id)
            if entry is None or entry.executions.get(msg_id) != (sharer.replica_id,
                                                                 sharer.host_id):
                del self._sharers[(kernel_id, msg_id)]
            elif host_id is None or sharer.host_id == host_id:
                live[(kernel_id, msg_id)] = sharer
        return live

    def _device_holders(self, host_id: str) -> dict[int, list[str]]:
        """Device id -> the replicas (owners) holding it on ``host_id``, first holder first.
        Lock held."""
        holders: dict[int, list[str]] = {}
        host = self.cluster.hosts.get(host_id)
        if host is None:
            return holders
        for owner in sorted(host.owners):
            for device_id in host.commitment_of(owner) or ():
                holders.setdefault(device_id, []).append(owner)
        for (kernel_id, _), sharer in self._live_sharers(host_id).items():
            for device_id in sharer.device_ids:
                holders.setdefault(device_id, []).append(
                    replica_owner(kernel_id, sharer.replica_id))
        return holders

    def shared_devices(self, host_id: str) -> dict[int, list[str]]:
        """Devices two cells share on ``host_id`` now: device id -> their replicas. Lock held."""
        return {d: owners for d, owners in self._device_holders(host_id).items()
                if len(owners) >= 2}

    def _sharing_view(self, entry: KernelEntry, kernel) -> SharingView:  # noqa: ANN001
        """What the share post-filter of the scheduling cycle reads: this kernel as a sharing
        party and, for each replica's host, who holds which device and its GPU memory. Lock
        held."""
        replicas = {}
        for rid, link_info in entry.replicas.items():
            host_id = link_info.host_id
            link = self.hosts.get(host_id)
            if link is None:
                continue
            devices = {device_id: tuple(self._party(owner.rpartition("/")[0])
                                        for owner in owners)
                       for device_id, owners in self._device_holders(host_id).items()}
            vram = {g["device_id"]: float(g.get("vram_gb", 0.0)) for g in link.gpus}
            replicas[rid] = ReplicaDevices(host_id, devices, vram)
        return SharingView(self._party(entry.kernel_id), replicas)

    def _apply_share(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                     result: CycleResult) -> tuple[tuple[int, list[int]] | None, str]:
        """The cycle decided the cell shares devices (``result.share``, best first): ask the
        hosts, in that order. ((replica, device ids) or None, why the hosts refused)."""
        refused: list[str] = []
        for plan in result.share:
            link = self.hosts.get(plan.host_id)
            if link is None:
                refused.append(f"host {plan.host_id} is gone")
                continue
            device_ids, shared, reason = link.commit_gpus_shared(
                kernel_id, plan.replica_id, msg_id, request.gpus, share=True,
                preferred=list(plan.device_ids))
            if device_ids is None:
                refused.append(reason)
                continue
            with self.lock:
                entry = self.kernels.get(kernel_id)
                kernel = self.cluster.kernels.get(kernel_id)
                if entry is None or kernel is None:
                    return None, ""  # stopped meanwhile; its replicas release what they hold
                if shared:
                    self._record_shared_commit(entry, kernel, msg_id, plan.replica_id,
                                               plan.host_id, device_ids)
                else:  # the devices came free meanwhile: an ordinary commitment
                    self._record_commit(entry, kernel, msg_id, plan.replica_id, plan.host_id,
                                        request, device_ids)
            if shared:
                log.info("kernel %s: cell %s shares GPU(s) %s on %s (%s)", kernel_id,
                         msg_id[:8], shared, plan.host_id, "; ".join(plan.reasons))
            return (plan.replica_id, device_ids), ""
        return None, f"; not shared: {'; '.join(refused)}" if refused else ""

    def _record_shared_commit(self, entry: KernelEntry, kernel, msg_id: str,  # noqa: ANN001
                              rid: int, host_id: str, device_ids: list[int]) -> None:
        """As ``_record_commit``, for a cell that joined devices another cell holds: the cluster
        model keeps the first holder's commitment; this cell is kept with the sharers. Lock
        held."""
        self._sharers[(entry.kernel_id, msg_id)] = Sharer(host_id, rid, tuple(device_ids))
        kernel.executor = rid
        entry.executions[msg_id] = (rid, host_id)
        entry.last_cell_gpus[rid] = device_ids
        entry.gpu_commits[msg_id] = (time.monotonic(), len(device_ids))

    def _sharing_released(self, kernel_id: str, msg_id: str, host_id: str) -> None:
        """A cell released its GPUs on ``host_id``: forget it if it was a sharer; a sharer whose
        devices no other cell holds now takes them over in the cluster model. Lock held."""
        self._sharers.pop((kernel_id, msg_id), None)
        host = self.cluster.hosts.get(host_id)
        if host is None:
            return
        for (kid, mid), sharer in self._live_sharers(host_id).items():
            holders = self._device_holders(host_id)
            owner = replica_owner(kid, sharer.replica_id)
            if any(holders.get(d) != [owner] for d in sharer.device_ids):
                continue
            kernel = self.cluster.kernels.get(kid)
            if kernel is None:
                continue
            try:
                host.commit(owner, kernel.request, sharer.device_ids)
            except AccountingError as exc:
                log.warning("GPU sharing: %s keeps sharing devices %s on %s: %s", owner,
                            list(sharer.device_ids), host_id, exc)
                continue
            del self._sharers[(kid, mid)]
