"""Run a replica module cold.

``python -m notebookos.local_scheduler.child MODULE ARGS...`` is ``python -m MODULE ARGS...`` after
``spawn.die_with_parent()`` (it exits if its Local Scheduler already died) and
``spawn.become_replica()`` (from then on it outlives it, see ``orphan_watch``).
"""

from __future__ import annotations

import runpy
import sys

from notebookos.local_scheduler.spawn import become_replica, die_with_parent


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m notebookos.local_scheduler.child MODULE [ARGS...]",
              file=sys.stderr)
        sys.exit(2)
    die_with_parent()  # no replica yet: a Local Scheduler that dies meanwhile takes it along
    become_replica()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
