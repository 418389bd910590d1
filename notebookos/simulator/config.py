"""Simulation settings: cluster shape, latencies, autoscaling and billing (all in seconds/USD)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from notebookos.policies.cell_order import CELL_ORDERS

PLACEMENTS = ("pooled", "consolidated", "sensitive")
SLOWDOWN_MODES = ("off", "model")  # notebookos.simulator.job_placement


def parse_cluster(text: str) -> tuple[int, int]:
    """``"20x8"`` -> (20 hosts, 8 GPUs each)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text or "")
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ValueError(f"cluster {text!r} must look like HOSTSxGPUS with both >= 1, e.g. 20x8")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class SimConfig:
    hosts: int = 4  # hosts at t=0 (job policies: the fixed cluster)
    gpus_per_host: int = 8
    placement: str = "pooled"  # job policies: may a job's GPUs span hosts
    # job policies: "model": a job spread over hosts runs slower by its model's factor
    # (job_placement.py); "off": placement costs nothing (the figures before issue 35)
    placement_slowdown: str = "off"
    autoscale: bool = True  # session policies only
    max_hosts: int = 100_000
    # Latencies (s), from the live system's own benchmarks (docs/simulator.md lists the source of
    # each; the state I/O figures are those of a 1 GiB state, the same for every policy).
    container_start_s: float = 2.24  # a cold container starts (benchmarks/deploy.py, docker cold)
    prewarm_promotion_s: float = 1.0  # a prewarmed container becomes a replica (docker pool 1.01)
    migration_state_s: float = 4.3  # a migrated replica catches up (benchmarks/kernel.py large read)
    prewarm_per_host: int = 1  # notebookos's small prewarm pool, per host
    lcp_warmup_s: float = 5.3  # lcp: a warm container is promoted (1.0) and reads the state (4.3)
    state_read_s: float = 4.3  # a fresh container reads the session's state (batch)
    state_write_s: float = 7.5  # the state is written back (batch after each cell; reservation's
    #                             persist on the reply's path, appendix A.3 step 9)
    request_overhead_s: float = 0.0036  # client -> code and back on the uncontended path
    election_s: float = 0.003  # replicated kernels: the executor election (step 6)
    immediate_within_s: float = 1.0  # a task is "immediate" when its code starts within this
    host_provision_s: float = 90.0  # the autoscaler's VM provisioning delay
    scaling_interval_s: float = 60.0
    drain_hysteresis_hosts: int = 2  # scale_in=drain: move replicas only above this surplus
    # Hibernation (global_scheduler.hibernate_after_s): a session kernel with no cell for this
    # long stops its replicas; its next cell wakes it (0: never, the default here so that the
    # published figures stand; the live default is 3600).
    hibernate_after_s: float = 0.0
    wake_s: float = 4.85  # a wake with replicas from the prewarm pool: 100 MiB + a torch model
    #                       (benchmarks/hibernate.py); a replica without a warm container adds
    #                       container_start_s - prewarm_promotion_s
    preemption_overhead_s: float = 0.0  # job policies: added to a preempted job's remaining time
    # Billing (paper section 5.5).
    host_usd_per_hour: float = 24.48  # an 8-GPU VM (AWS p3.16xlarge on demand)
    markup: float = 1.15  # users pay 1.15x the provider's rate for what they use
    standby_fraction: float = 0.125  # a standby replica pays 12.5% of the VM's rate (x markup)
    standby_billing: str = "flat"  # flat per standby replica (5.5's example), or per_gpu
    reservation_billing: str = "reserved"  # reservation pays every GPU-hour it holds, or usage
    timeline_points: int = 2000  # about this many timeline samples
    cell_order: str = "arrival"  # session policies: global_scheduler.cell_order (cell_order.py)
    seed: int = 0
    policy_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hosts < 0 or self.gpus_per_host < 1 or self.max_hosts < max(1, self.hosts):
            raise ValueError("need hosts >= 0, gpus_per_host >= 1 and max_hosts >= hosts")
        if self.cell_order not in CELL_ORDERS:
            raise ValueError(f"cell_order {self.cell_order!r} must be one of "
                             f"{', '.join(CELL_ORDERS)}")
        if self.standby_billing not in ("flat", "per_gpu"):
            raise ValueError(f"standby_billing {self.standby_billing!r} must be flat or per_gpu")
        if self.reservation_billing not in ("usage", "reserved"):
            raise ValueError(f"reservation_billing {self.reservation_billing!r} must be usage or "
                             "reserved")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} must be one of {', '.join(PLACEMENTS)}")
        if self.placement_slowdown not in SLOWDOWN_MODES:
            raise ValueError(f"placement_slowdown {self.placement_slowdown!r} must be one of "
                             f"{', '.join(SLOWDOWN_MODES)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_s", "_usd_per_hour")) and not value >= 0:
                raise ValueError(f"{f.name}={value!r} must be >= 0")
        if self.scaling_interval_s <= 0 or self.timeline_points < 1:
            raise ValueError("scaling_interval_s must be > 0 and timeline_points >= 1")

    @property
    def gpu_usd_per_hour(self) -> float:
        return self.host_usd_per_hour / self.gpus_per_host
