"""What the Global Scheduler gives a kernel's front: every hook the front calls, on one interface.

The front (front.py) routes messages; deciding anything about the cluster is the service's. The
front calls these hooks on its loop (never holding anything of its own); placing a cell may
wait, so it is ``place_execute_async``, a task on the loop (the service's), or a blocking
``place_execute`` run on a thread of the placement pool (a stand-in's). The
service (``GlobalSchedulerService``) implements all of them; a stand-in (tests, benchmarks) may
leave out the optional ones, which the front then skips (``call_optional``).
"""

from __future__ import annotations

from typing import Any, Protocol


class PlacementFailed(Exception):
    """No replica can run the request now; the message says why."""


class FrontHooks(Protocol):
    # -- required ---------------------------------------------------------------------------

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        """(executor replica id, committed GPU device ids); raises PlacementFailed. Called on
        a thread of its own: it may wait (for GPUs, a migration)."""

    # A front prefers ``place_execute_async(kernel_id, msg_id, metadata)`` when the hooks have
    # it: the same answer from a coroutine on the front's loop, holding no thread while it waits.

    def release_execute(self, kernel_id: str, msg_id: str) -> None:
        """The cell's GPUs go back: it was answered, withdrawn after placement, or its
        executor was lost before it was sent."""

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        """The executor ``replica_id`` answered the cell ``msg_id``."""

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        """The executor published ``execute_input``: the cell's code starts now."""

    # -- optional (``call_optional``) -----------------------------------------------------

    def cancel_execute(self, kernel_id: str, msg_id: str) -> None:
        """The cell being placed was withdrawn (an interrupt): stop waiting for it."""

    def execute_abandoned(self, kernel_id: str, msg_id: str) -> None:
        """The cell ``msg_id`` was answered without running under that id (every replica
        asked yielded or was lost before its ``execute_input``; it may be resubmitted under
        another id): it no longer waits to start."""

    def message_dropped(self, kernel_id: str, reason: str) -> None:
        """The front dropped a message (``bad_signature`` or ``malformed``): count it."""

    def shutdown_requested(self, kernel_id: str) -> None:
        """A client asked the kernel to shut down: its replicas are about to exit on
        purpose, and their exits are not failures."""


OPTIONAL_HOOKS = ("cancel_execute", "execute_abandoned", "message_dropped", "shutdown_requested")


def call_optional(hooks: Any, name: str, *args: Any) -> None:
    """Call the optional hook ``name`` when ``hooks`` has it."""
    assert name in OPTIONAL_HOOKS, name
    hook = getattr(hooks, name, None)
    if hook is not None:
        hook(*args)
