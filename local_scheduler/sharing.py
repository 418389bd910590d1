"""GPU sharing on one host: what a replica that may share its GPU with another kernel's executor
is started with.

Two executors bound to the same device id time-slice it; with an MPS control daemon on the host
(``nvidia-cuda-mps-control -d``), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the share of the
GPU's SMs each process may use, the stand-in for LithOS's spatial partitioning. MPS reads the cap
when the process creates its CUDA context, so it is part of the replica's environment at launch.
"""

from __future__ import annotations

MPS_PERCENTAGE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def replica_environment(mps_percentage: int | None = None) -> dict[str, str]:
    """Environment variables for a replica whose executor may share a GPU; ``mps_percentage``
    (1-100) caps its share of the SMs under MPS, ``None`` leaves it uncapped."""
    if mps_percentage is None:
        return {}
    if not 1 <= mps_percentage <= 100:
        raise ValueError(f"an MPS share is a percentage of the GPU's SMs, 1 to 100; got "
                         f"{mps_percentage}")
    return {MPS_PERCENTAGE_VAR: str(mps_percentage)}
