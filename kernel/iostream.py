"""The replica's stdout/stderr: ipykernel's ``OutStream`` whose ``flush()`` returns at once when
the stream holds nothing.

ipykernel flushes stdout and stderr before every reply and again before every ``idle``; each
flush hands a callback to the IOPub thread and waits for it to run, even with nothing to send.
In a replica that thread competes with the Raft tick thread for the GIL right when a cell ends,
and the four empty round trips cost about 2 ms of every trivial cell (measured in the Jupyter
benchmark's timeline, docs/performance.md). With nothing buffered and no flush pending there is
nothing to order either: what was sent before is already queued on the IOPub thread, in order.

And a standby publishes nothing for a cell another replica runs: what the replica writes under a
``yield_request``'s parent (a library's warning while it applies or restores state, a trace line)
goes to the process's own stderr, the replica's log. Published under the cell's id, it made the
Global Scheduler's front take the standby for the replica running the cell
(``front_iopub._executor_revealed``, there for a cell resent after a scheduler restart), and the
cell never replied (found by the torch-wake work: a trace line on stderr hung every wake).
"""

from __future__ import annotations

import os
import sys
import threading

from ipykernel.iostream import OutStream

YIELD_REQUEST = "yield_request"  # the copy of a cell a standby gets (kernel-protocol.md)


class ReplicaOutStream(OutStream):
    def write(self, string: str) -> int | None:  # type: ignore[override]
        if isinstance(string, str) and self.parent_header.get("msg_type") == YIELD_REQUEST:
            return self._write_to_process_log(string)
        return super().write(string)

    def _write_to_process_log(self, string: str) -> int:
        """A standby's output, kept from IOPub: to the stream this one replaced (the log)."""
        if threading.current_thread() is getattr(self, "watch_fd_thread", None):
            return len(string)  # output at the fd level: the watcher copies it to the log itself
        original = getattr(self, "_original_stdstream_copy", None)
        data = string.encode(errors="replace")
        try:
            if original is not None:
                os.write(original, data)
            else:
                stream = sys.__stderr__
                if stream is not None:
                    stream.write(string)
                    stream.flush()
        except OSError:
            pass  # no log to write to: the output is dropped, as a standby's always should be
        return len(string)

    def flush(self) -> None:
        if self._holds_output():
            super().flush()

    def _holds_output(self) -> bool:
        if self._flush_pending or self._subprocess_flush_pending:
            return True
        with self._buffer_lock:
            return any(buffer.tell() for buffer in self._buffers.values())
