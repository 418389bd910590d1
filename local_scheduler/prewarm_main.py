"""A prewarmed replica: the interpreter is up and the heavy imports are done.

Started by the Local Scheduler's prewarm pool as ``python -m notebookos.local_scheduler.prewarm_main
[--order-file PATH] MODULE``. It imports what a replica needs, prints ``ready`` on stdout and waits
for its order, a JSON object ``{"argv": [...], "env": {...}, "log": PATH}`` (``log`` optional):

- a process (the process launcher) reads one JSON line on stdin; EOF means the pool closed its
  pipe, and the process exits;
- a container (the Docker launcher) watches ``--order-file``, which the Local Scheduler copies in.

It then sends its output to ``log`` (when given) and runs ``MODULE`` as ``__main__`` with that argv,
exactly as a cold ``python -m MODULE ...`` would.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import runpy
import sys
import time

from notebookos.local_scheduler.spawn import become_replica, die_with_parent

# No "pysyncobj" before the replica's own package: notebookos.kernel stands in for pysyncobj's
# encryptor module first, which would load `cryptography` (9 MB a replica, unused: issue 36);
# notebookos.kernel.app imports pysyncobj after it.
HEAVY_IMPORTS = ("zmq", "ipykernel.kernelapp", "ipykernel.ipkernel", "IPython", "cloudpickle",
                 "numpy", "notebookos.kernel.app")  # the last: the replica itself
# What every replica imports while it starts, after the above (ipykernel and IPython import them
# inside initialize(): psutil for jupyter_client's local interfaces, sqlite3 for the history,
# pdb for the debugger; the replica its state sync and store). ~50 ms of CPU per replica, three
# replicas at once. tests/schedulers/test_prewarm_imports.py keeps this list complete.
START_IMPORTS = ("psutil", "sqlite3", "pdb", "IPython.core.debugger", "IPython.core.completerlib",
                 "IPython.core.oinspect", "IPython.extensions.storemagic",
                 "tornado.platform.asyncio", "tornado.queues", "blake3", "faulthandler",
                 "unicodedata", "notebookos.kernel.checkpoint_log", "notebookos.kernel.iostream",
                 "notebookos.store.file_store", "notebookos.kernel.module_warmup")
PRELOAD_ENV = "NOTEBOOKOS_PRELOAD_MODULES"
# when the process became a replica: its start-up is timed from here (kernel/replica.py, the
# same name there: this module is imported by the Local Scheduler, which never loads a kernel)
LAUNCHED_AT_ENV = "NOTEBOOKOS_REPLICA_LAUNCHED_AT"
USAGE = "usage: python -m notebookos.local_scheduler.prewarm_main [--order-file PATH] MODULE"


def wait_for_order_file(path: str, poll_s: float = 0.01) -> dict:
    """The order once ``path`` holds a complete JSON object (it may be seen half-written)."""
    while True:
        try:
            with open(path) as f:
                return json.loads(f.read())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(poll_s)


def extra_preloads() -> list[str]:
    """The host's ``local_scheduler.preload_modules`` (the Local Scheduler passes them on in
    ``PRELOAD_ENV``)."""
    return [n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(",") if n.strip()]


def preload(module: str) -> None:
    """Import what a replica of ``module`` needs (a missing optional import only costs time):
    the heavy imports, and ``module`` itself where it is a package (``python -m`` runs its
    ``__main__``, not its ``__init__``), else its package: importing a plain module would run
    it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    own = module if spec is not None and spec.submodule_search_locations is not None else (
        module.rpartition(".")[0])
    for name in (*HEAVY_IMPORTS, *START_IMPORTS, *([own] if own else []), *extra_preloads()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing optional import only costs start time
            pass


def run_order(order: dict, module: str) -> int:
    """Become the replica ``order`` describes: its output to ``order["log"]`` (else nowhere: this
    process's stdout may be a pipe its starter reads), stdin from /dev/null, ``order["env"]``
    added to the environment, then ``MODULE`` run as ``__main__`` with ``order["argv"]``."""
    log_fd = (os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
              if order.get("log") else os.open(os.devnull, os.O_WRONLY))
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.update(order.get("env", {}))
    os.environ[LAUNCHED_AT_ENV] = repr(time.time())
    become_replica()
    sys.argv = [module, *order["argv"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str]) -> int:
    order_file = None
    if len(argv) == 3 and argv[0] == "--order-file":
        order_file, argv = argv[1], argv[2:]
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    module = argv[0]
    die_with_parent()
    preload(module)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if order_file is not None:
        order = wait_for_order_file(order_file)
    else:
        line = sys.stdin.readline()
        if not line:
            return 0
        order = json.loads(line)
    return run_order(order, module)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
