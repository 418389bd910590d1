"""Which GPUs this host offers: the real devices nvidia-smi lists, else configured virtual ones."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Gpu:
    device_id: int
    name: str
    vram_gb: float


def real_gpus(timeout_s: float = 5.0) -> list[Gpu]:
    """The GPUs nvidia-smi reports; empty when there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Devices from ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            gpus.append(Gpu(int(parts[0]), parts[1], float(parts[2]) / 1024.0))
        except ValueError:
            continue
    return gpus


def detect_gpus(virtual_count: int, vram_gb_per_virtual: float) -> tuple[list[Gpu], bool]:
    """(devices, virtual): real devices when found, else ``virtual_count`` virtual ones."""
    found = real_gpus()
    if found:
        return found, False
    return [Gpu(i, "virtual", vram_gb_per_virtual) for i in range(virtual_count)], True
