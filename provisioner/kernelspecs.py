"""The ``notebookos`` kernelspecs: one per GPU request, all using ``notebookos-provisioner``.

``notebookos`` asks for 1 GPU per cell; ``notebookos-0gpu``, ``notebookos-2gpu``,
``notebookos-4gpu`` and ``notebookos-8gpu`` ask for 0, 2, 4 and 8. A programmatic client picks the
request by the kernelspec name it starts over the REST API (``POST /api/kernels`` with
``{"name": "notebookos-2gpu"}``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

PROVISIONER_NAME = "notebookos-provisioner"
GPU_VARIANTS = (1, 0, 2, 4, 8)


def kernelspec_name(gpus: int) -> str:
    return "notebookos" if gpus == 1 else f"notebookos-{gpus}gpu"


def kernelspec(gpus: int) -> dict:
    plural = "GPU" if gpus == 1 else "GPUs"
    return {
        # The provisioner launches nothing locally: replicas are started by the Local Schedulers.
        # argv is kept valid (a single replica) for tools that read it.
        "argv": [sys.executable, "-m", "notebookos.kernel", "-f", "{connection_file}"],
        "display_name": f"Python 3 (NotebookOS, {gpus} {plural})",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "debugger": False,
            "kernel_provisioner": {
                "provisioner_name": PROVISIONER_NAME,
                "config": {"gpus": gpus},
            },
        },
    }


def install_kernelspecs(user: bool = False, prefix: str | None = None) -> list[str]:
    """Install every variant; returns the directories written."""
    manager = KernelSpecManager()
    written = []
    for gpus in GPU_VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "kernel.json").write_text(json.dumps(kernelspec(gpus), indent=2))
            written.append(manager.install_kernel_spec(
                tmp, kernelspec_name(gpus), user=user, prefix=prefix
            ))
    return written


def remove_kernelspecs() -> list[str]:
    manager = KernelSpecManager()
    removed = []
    for gpus in GPU_VARIANTS:
        try:
            removed.append(manager.remove_kernel_spec(kernelspec_name(gpus)))
        except KeyError:
            continue
    return removed
