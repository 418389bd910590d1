"""What a kernel's start request tells the scheduling policies about it (``PolicyHints.extra``).

The provisioner fills these from Jupyter (who runs the notebook, which notebook) and from the
kernelspec's provisioner configuration (the GPU sharing SLA and workload type); the Global
Scheduler validates them at StartKernel and keeps them with the kernel (through restarts):

| key | meaning | used by |
|---|---|---|
| ``user`` | who runs the notebook (JupyterHub's user, else the Jupyter Server's) | cell queue fairness (``themis``), per-user history (``qssf``) |
| ``notebook`` | the notebook's path (Jupyter's ``JPY_SESSION_NAME``) | per-notebook history of cell durations (``qssf``) |
| ``gpu_sla`` | the largest slowdown this kernel's cells accept from sharing a GPU (TensorShare's gSLA); 1 = never share | GPU sharing (``tensorshare``) |
| ``gpu_workload`` | what the notebook trains (a model name such as ``resnet18``), for the sharing slowdown predictor | GPU sharing |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

USER = "user"
NOTEBOOK = "notebook"
GPU_SLA = "gpu_sla"
GPU_WORKLOAD = "gpu_workload"
KNOWN = (USER, NOTEBOOK, GPU_SLA, GPU_WORKLOAD)
MAX_GPU_SLA = 10.0
MAX_TEXT = 256


class InvalidHints(ValueError):
    """A hint that cannot be used; the message names it and says what is allowed."""


@dataclass(frozen=True, slots=True)
class KernelHints:
    user: str = ""
    notebook: str = ""
    gpu_sla: float = 1.0
    gpu_workload: str = ""

    @property
    def shares_gpus(self) -> bool:
        """The kernel accepts some slowdown from sharing a GPU with another kernel."""
        return self.gpu_sla > 1.0

    @classmethod
    def from_map(cls, extra: Mapping[str, str]) -> KernelHints:
        """Validate ``PolicyHints.extra``; unknown keys are other policies' knobs and are kept
        out of this view, not refused."""
        for key in (USER, NOTEBOOK, GPU_WORKLOAD):
            if len(extra.get(key, "")) > MAX_TEXT:
                raise InvalidHints(f"hints.extra[{key!r}] is longer than {MAX_TEXT} characters")
        raw = extra.get(GPU_SLA, "").strip()
        sla = 1.0
        if raw:
            try:
                sla = float(raw)
            except ValueError:
                raise InvalidHints(f"hints.extra['gpu_sla']={raw!r} is not a number; it is the "
                                   "largest slowdown accepted from sharing a GPU, 1 (never "
                                   f"share) to {MAX_GPU_SLA:g}") from None
            if not math.isfinite(sla) or not 1.0 <= sla <= MAX_GPU_SLA:
                raise InvalidHints(f"hints.extra['gpu_sla']={raw!r} must be between 1 (never "
                                   f"share) and {MAX_GPU_SLA:g}")
        return cls(extra.get(USER, ""), extra.get(NOTEBOOK, ""), sla, extra.get(GPU_WORKLOAD, ""))

    def to_map(self) -> dict[str, str]:
        out = {USER: self.user, NOTEBOOK: self.notebook, GPU_WORKLOAD: self.gpu_workload}
        if self.gpu_sla != 1.0:
            out[GPU_SLA] = f"{self.gpu_sla:g}"
        return {k: v for k, v in out.items() if v}
