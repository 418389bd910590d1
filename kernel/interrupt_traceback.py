"""An interrupted cell's traceback as a plain kernel shows it.

A replica handles SIGINT with a Python function (``ReplicaKernel._on_sigint``: it must ignore
an interrupt while the replica waits for its Raft group), so the ``KeyboardInterrupt`` it raises
carries that function's frame as its last: the user saw NotebookOS's own source
(``File .../kernel/replica.py, in ReplicaKernel._on_sigint``) under their cell's line, where a
plain ipykernel, whose handler is C, shows only the line of the cell. IPython never hides the
last frame of a traceback, even one marked ``__tracebackhide__``. So the replica gives IPython a
handler for ``KeyboardInterrupt`` (``InteractiveShell.set_custom_exc``) that cuts the signal
handler's frame off the traceback and shows the rest as IPython would; ``sys.last_traceback``
(``%debug``, ``%tb``) gets the same, shorter traceback.
"""

from __future__ import annotations

from types import CodeType, TracebackType
from typing import Any


def without_frames_of(tb: TracebackType | None, code: CodeType) -> TracebackType | None:
    """``tb`` with every entry whose frame runs ``code`` cut out (tracebacks are writable)."""
    while tb is not None and tb.tb_frame.f_code is code:
        tb = tb.tb_next
    head = tb
    while tb is not None:
        nxt = tb.tb_next
        while nxt is not None and nxt.tb_frame.f_code is code:
            nxt = nxt.tb_next
        tb.tb_next = nxt
        tb = nxt
    return head


def hide_handler_frame(shell: Any, handler_code: CodeType) -> None:
    """Make ``shell`` (an IPython ``InteractiveShell``) show a ``KeyboardInterrupt`` without
    the frames of the signal handler whose code is ``handler_code``. Leaves a handler the user
    (or another extension) set for other exceptions alone: it only adds when none is set."""
    if shell is None or shell.custom_exceptions:
        return

    def show(self: Any, etype: type, value: BaseException, tb: TracebackType,
             tb_offset: int | None = None) -> None:
        tb = without_frames_of(tb, handler_code)
        value.__traceback__ = tb
        self.showtraceback((etype, value, tb), tb_offset=tb_offset)

    shell.set_custom_exc((KeyboardInterrupt,), show)
