"""The ``kernel_info_reply`` a kernel's front gives while its replicas are still starting.

Jupyter Server and JupyterLab ask for kernel_info as soon as a kernel exists, and JupyterLab
sends a cell only once it has the answer. A front bound before its replicas are ready answers
with the reply content of a replica it has seen (the Global Scheduler passes one when it has
it), else with this one: what a replica (an IPython kernel, kernel/replica.py) says about itself,
for the Python the cluster runs. The metadata says ``notebookos.starting``.
"""

from __future__ import annotations

import platform

PROTOCOL_VERSION = "5.3"


def starting_kernel_info() -> dict:
    return {
        "status": "ok",
        "protocol_version": PROTOCOL_VERSION,
        "implementation": "notebookos",
        "implementation_version": "0.1.0",
        "language_info": {
            "name": "python",
            "version": platform.python_version(),
            "mimetype": "text/x-python",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "pygments_lexer": "ipython3",
            "nbconvert_exporter": "python",
            "file_extension": ".py",
        },
        "banner": "NotebookOS distributed kernel (its replicas are starting)",
        "help_links": [],
        "debugger": False,
    }
