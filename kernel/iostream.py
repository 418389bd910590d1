"""The replica's stdout/stderr: ipykernel's ``OutStream`` whose ``flush()`` returns at once when
the stream holds nothing.

ipykernel flushes stdout and stderr before every reply and again before every ``idle``; each
flush hands a callback to the IOPub thread and waits for it to run, even with nothing to send.
In a replica that thread competes with the Raft tick thread for the GIL right when a cell ends,
and the four empty round trips cost about 2 ms of every trivial cell (measured in the Jupyter
benchmark's timeline, docs/performance.md). With nothing buffered and no flush pending there is
nothing to order either: what was sent before is already queued on the IOPub thread, in order.
"""

from __future__ import annotations

from ipykernel.iostream import OutStream


class ReplicaOutStream(OutStream):
    def flush(self) -> None:
        if self._holds_output():
            super().flush()

    def _holds_output(self) -> bool:
        if self._flush_pending or self._subprocess_flush_pending:
            return True
        with self._buffer_lock:
            return any(buffer.tell() for buffer in self._buffers.values())
