"""The autoscaler (DESIGN section 5): every interval, ask the policy how many hosts the cluster
needs (committed GPUs x factor plus a buffer, and enough to hold the subscriptions), then add hosts
through the provider or release idle ones, moving their idle replicas off first. With
``global_scheduler.scaling = ces`` the decision is Helios's forecast-driven energy saving
instead (``notebookos.policies.forecast_scaling``): hosts sleep when the recent trend and the
demand forecast fall, and waiting cells wake what they lack; the history of checks the forecast
learns from is kept in the state directory across restarts."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import grpc

from notebookos.global_scheduler.providers import HostProvider
from notebookos.global_scheduler.service import GlobalSchedulerService
from notebookos.policies import ScalingView
from notebookos.policies.forecast_scaling import ForecastScaling
from notebookos.policies.scale_in import DEFAULT_LIMIT, effective_mode, releasable_hosts

log = logging.getLogger(__name__)

RELEASE_DRAIN_S = 10.0  # scale-in: how long a host's replicas may take to move off it


class Autoscaler:
    def __init__(self, service: GlobalSchedulerService, provider: HostProvider, *,
                 interval_s: float, gpus_per_host: int, max_hosts: int,
                 provision_timeout_s: float = 60.0, forecast: ForecastScaling | None = None,
                 history_path: Path | None = None) -> None:
        self.service = service
        self.provider = provider
        self.interval_s = interval_s
        self.gpus_per_host = gpus_per_host
        self.max_hosts = max_hosts
        self.provision_timeout_s = provision_timeout_s
        self._provisioning: dict[str, float] = {}  # host id -> when asked for
        self._waiting_gpus = 0
        self.forecast = forecast
        self.history_path = history_path
        if forecast is not None and history_path is not None:
            forecast.restore(self._load_history(history_path))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="autoscaler")
        service.on_capacity_wanted = self.capacity_wanted

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.provider.close()

    def capacity_wanted(self, gpus: int) -> None:
        """A request waits for GPUs no host can bind now: count it in the next decision."""
        self._waiting_gpus = max(self._waiting_gpus, gpus)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the autoscaler must keep running
                log.exception("autoscaler tick failed")

    def tick(self) -> None:
        svc = self.service
        now = time.monotonic()
        with svc.lock:
            for host_id in [h for h in self._provisioning if h in svc.hosts
                            or now - self._provisioning[h] > self.provision_timeout_s]:
                del self._provisioning[host_id]
            cluster = svc.cluster
            svc.policy.observe(cluster)
            # Which hosts may go, and in which order: the decision the simulator takes too
            # (policies/scale_in.py): under the policy's scale_in, hosts holding nothing
            # (`empty`) or with no GPU bound (`idle`, `drain`: their replicas move first,
            # release()); fewest replicas first, the newest host first. Kept: hosts draining
            # already and those the provider cannot release.
            releasable = releasable_hosts(
                cluster, effective_mode(svc.policy),
                keep=self._keeps,
                limit=getattr(svc.policy, "candidate_limit", DEFAULT_LIMIT))
            active = [h for h, link in svc.hosts.items() if not link.draining]
            gpus = sum(cluster.hosts[h].capacity.gpus for h in active)
            per_host = round(gpus / len(active)) if active and gpus else self.gpus_per_host
            view = ScalingView(
                hosts=len(active) + len(self._provisioning),
                gpus_per_host=max(1, per_host), committed_gpus=cluster.committed_gpus,
                waiting_gpus=self._waiting_gpus, subscribed_gpus=cluster.subscribed_gpus,
                releasable_host_ids=releasable)
            self._waiting_gpus = 0
            running = sum(1 for h in active if cluster.hosts[h].committed.gpus > 0)
        if self.forecast is not None:
            checked = self.forecast.observe(now, running)
            if checked:
                self._save_history()
            decision = self.forecast.decide(view, now, asleep=self.provider.wakeable(view.hosts, self.max_hosts),
                                            checked=checked)
            if decision.add_hosts or decision.release_host_ids:
                log.info("autoscaler (ces): %s", self.forecast.report())
        else:
            decision = svc.policy.scaling(view)
        if decision.add_hosts > 0:
            add = min(decision.add_hosts, self.max_hosts - view.hosts)
            if add > 0:
                log.info("autoscaler: scaling out by %d host(s) (%d committed GPUs, %d hosts)",
                         add, view.committed_gpus, view.hosts)
                for host_id in self.provider.add_hosts(add):
                    self._provisioning[host_id] = time.monotonic()
                    svc.metrics.scale_events.labels(direction="out").inc()
        for host_id in decision.release_host_ids:
            self.release(host_id)

    def _keeps(self, host_id: str) -> bool:
        """Scale-in vetoes (under the service's lock): a host not registered (any more), one
        draining already, one the provider cannot release."""
        link = self.service.hosts.get(host_id)
        return link is None or link.draining or not self.provider.can_release(host_id)

    @staticmethod
    def _load_history(path: Path) -> list[float]:
        try:
            values = json.loads(path.read_text())["running_hosts"]
            return [float(v) for v in values]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("autoscaler: ignoring the unreadable scaling history %s: %s", path, exc)
            return []

    def _save_history(self) -> None:
        if self.history_path is None or self.forecast is None:
            return
        try:
            self.history_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.history_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"running_hosts": self.forecast.history}))
            tmp.replace(self.history_path)
        except OSError as exc:
            log.warning("autoscaler: could not keep the scaling history: %s", exc)

    def release(self, host_id: str) -> bool:
        """Drain ``host_id`` (host_drain.py: its replicas move elsewhere, placed by the
        container cycle, each once its cell has ended), then give it back to the provider.
        A host whose replicas cannot all move within ``RELEASE_DRAIN_S`` is kept."""
        svc = self.service
        with svc.lock:
            link = svc.hosts.get(host_id)
            if link is None:
                return False
        log.info("autoscaler: scaling in host %s", host_id)
        _moved, stayed, detail = svc.drain_host(host_id, time.monotonic() + RELEASE_DRAIN_S,
                                                reason="scale_in", settle=False)
        if stayed:
            log.info("autoscaler: keeping host %s: %s", host_id, detail)
            with svc.lock:
                link.draining = False
            return False
        try:
            self.provider.release_host(host_id, link.address)  # the host stays draining
        except grpc.RpcError as exc:
            log.warning("autoscaler: releasing %s failed: %s", host_id, exc.details())
            with svc.lock:
                link.draining = False
            return False
        svc.metrics.scale_events.labels(direction="in").inc()
        return True
