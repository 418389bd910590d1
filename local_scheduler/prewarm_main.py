"""A prewarmed replica process: the interpreter is up and the heavy imports are done.

Started by the Local Scheduler's prewarm pool as ``python -m notebookos.local_scheduler.prewarm_main
MODULE``. It imports what a replica needs, prints ``ready`` on stdout and waits for one JSON line
on stdin: ``{"argv": [...], "env": {...}, "log": PATH}``. It then sends its output to ``log`` and
runs ``MODULE`` as ``__main__`` with that argv, exactly as a cold ``python -m MODULE ...`` would.
EOF closes the pool's pipe: the process exits.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys

from notebookos.local_scheduler.spawn import die_with_parent

HEAVY_IMPORTS = ("zmq", "ipykernel.kernelapp", "ipykernel.ipkernel", "IPython", "cloudpickle",
                 "pysyncobj", "numpy")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m notebookos.local_scheduler.prewarm_main MODULE", file=sys.stderr)
        return 2
    module = argv[0]
    die_with_parent()
    for name in (*HEAVY_IMPORTS, module.rsplit(".", 1)[0] if "." in module else module):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing optional import only costs start time
            pass
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        return 0
    order = json.loads(line)
    log_fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.environ.update(order.get("env", {}))
    sys.argv = [module, *order["argv"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
