"""The registry's writes as effects outside the scheduler's decisions (issue 32).

The service changes a kernel's or a host's record while it holds its state (``service.lock``);
the write itself (a journal line and, now and then, a whole new snapshot on disk; a round trip
to Redis, up to its 5 s timeout when Redis is slow) used to happen there too, so every front
hook and every gRPC call waited behind it. ``RegistryWriter`` takes the change instead and one
writer thread applies it: a change of the same record that arrives before the earlier one was
written replaces it (the registry holds each record's newest version, never a history), and
records are independent, so their order across records does not matter.

What a client is told stays durable: ``flush`` waits until every change made before it was
written, and the Global Scheduler's gRPC server calls it before each answer
(``FlushBeforeAnswer``, which never blocks the server's loop: a coroutine handler's answer
awaits ``flush_async``, which holds no thread), as the write under the lock did. A write that
fails is logged and tried again (newest version first) until it succeeds or the scheduler
stops; ``flush`` gives up after its timeout and says so in the log rather than holding the
answer for good.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import grpc

from notebookos.global_scheduler.grpc_loop import is_async
from notebookos.global_scheduler.registry_store import RegistryStore

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 10.0
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # backoff between tries of a failing write
Change = tuple[str, str, "dict[str, Any] | None"]  # (table, id, document; None: delete)


class RegistryWriter(RegistryStore):
    """A ``RegistryStore`` whose writes return at once and are applied, in one writer thread,
    to ``store``; ``load`` and ``flush`` see every change made before them."""

    def __init__(self, store: RegistryStore) -> None:
        self.store = store
        self._cv = threading.Condition()
        self._pending: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._made = 0  # changes taken
        self._written = 0  # changes taken and written (or replaced by a newer one written)
        self._closed = False
        self._thread: threading.Thread | None = None
        # flush_async's waiters: (changes wanted written, their loop, the future to resolve)
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = []

    # -- RegistryStore ----------------------------------------------------------------------

    def load(self) -> tuple[dict, dict]:
        self.flush()
        return self.store.load()

    def put_host(self, host_id: str, doc: dict[str, Any]) -> None:
        self._take("hosts", host_id, doc)

    def delete_host(self, host_id: str) -> None:
        self._take("hosts", host_id, None)

    def put_kernel(self, kernel_id: str, doc: dict[str, Any]) -> None:
        self._take("kernels", kernel_id, doc)

    def delete_kernel(self, kernel_id: str) -> None:
        self._take("kernels", kernel_id, None)

    def close(self) -> None:
        """Write what is pending (up to the flush timeout) and end the writer thread; a change
        taken after this is written at once, by its caller (the scheduler is stopping)."""
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            self._wake_async(everyone=True)
        if self._thread is not None:
            self._thread.join(timeout=FLUSH_TIMEOUT_S)

    # -- the writer -------------------------------------------------------------------------

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every change taken before this call is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            wanted = self._made
            while self._written < wanted:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    log.error("registry: %d change(s) not written after %.0f s; the scheduler "
                              "answers anyway and keeps trying", wanted - self._written,
                              timeout_s)
                    return False
                self._cv.wait(left)
        return True

    async def flush_async(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """``flush`` for a coroutine on a loop: awaited, holding no thread (the writer thread
        resolves it once the changes taken before this call are written)."""
        loop = asyncio.get_running_loop()
        with self._cv:
            wanted = self._made
            if self._written >= wanted:
                return True
            done: asyncio.Future[bool] = loop.create_future()
            if self._closed:
                done.set_result(False)
            else:
                self._async_waiters.append((wanted, loop, done))
        try:
            if await asyncio.wait_for(asyncio.shield(done), timeout_s):
                return True
        except TimeoutError:
            pass
        log.error("registry: %d change(s) not written after %.0f s; the scheduler answers "
                  "anyway and keeps trying", wanted - self._written, timeout_s)
        return False

    def _wake_async(self, everyone: bool = False) -> None:
        """Resolve the ``flush_async`` waiters whose changes are written (all of them, with
        False for those not written, when ``everyone``: the writer closes). Under ``_cv``."""
        kept = []
        for wanted, loop, done in self._async_waiters:
            if self._written >= wanted or everyone:
                try:
                    loop.call_soon_threadsafe(_settle, done, self._written >= wanted)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            else:
                kept.append((wanted, loop, done))
        self._async_waiters = kept

    @property
    def pending(self) -> int:
        with self._cv:
            return self._made - self._written

    def _take(self, table: str, record_id: str, doc: dict[str, Any] | None) -> None:
        with self._cv:
            if self._closed:
                self._apply({(table, record_id): doc})
                return
            self._pending.pop((table, record_id), None)  # the newest version, taken last
            self._pending[(table, record_id)] = doc
            self._made += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="registry-writer",
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return  # closed, nothing left
                batch, self._pending = self._pending, {}
                made = self._made
            failed = self._apply(batch)
            with self._cv:
                if failed:
                    for key, doc in failed.items():  # a newer version taken meanwhile wins
                        self._pending.setdefault(key, doc)
                else:
                    self._written = max(self._written, made)
                    self._cv.notify_all()
                    self._wake_async()
                closed = self._closed
            if failed:
                if closed:
                    log.error("registry: closing with %d change(s) not written", len(failed))
                    return
                time.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
                failures += 1
            else:
                failures = 0

    def _apply(self, batch: dict[tuple[str, str], dict[str, Any] | None]
               ) -> dict[tuple[str, str], dict[str, Any] | None]:
        """Write ``batch``; returns the changes that failed (empty when all were written)."""
        failed: dict[tuple[str, str], dict[str, Any] | None] = {}
        for (table, record_id), doc in batch.items():
            if failed:  # the store is failing: keep the rest for the retry, in order
                failed[(table, record_id)] = doc
                continue
            try:
                if table == "kernels":
                    if doc is None:
                        self.store.delete_kernel(record_id)
                    else:
                        self.store.put_kernel(record_id, doc)
                elif doc is None:
                    self.store.delete_host(record_id)
                else:
                    self.store.put_host(record_id, doc)
            except Exception as exc:  # noqa: BLE001 - kept and tried again
                log.warning("registry: could not write %s %s (%s); trying again", table,
                            record_id, exc)
                failed[(table, record_id)] = doc
        return failed


class FlushBeforeAnswer(grpc.aio.ServerInterceptor):
    """Each unary call is answered only once the registry changes made before its end are
    written: what a client was told survives a Global Scheduler restart, as when the writes
    were made under the lock.

    The wait never blocks the loop the server runs on: a synchronous handler's wrapper
    flushes in the pool thread the handler ran in (``grpc_loop.SyncHandlersInPool``, placed
    after this interceptor, runs it there); a coroutine handler's answer goes out at once when
    nothing is pending (a heartbeat writes nothing), and otherwise awaits ``flush_async``
    (no thread: a start's answer took one of the ``gs-grpc`` pool before, issue 32)."""

    def __init__(self, writer: RegistryWriter) -> None:
        self._writer = writer

    async def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner, writer = handler.unary_unary, self._writer
        if is_async(inner):  # as grpc.aio decides where a handler runs
            async def answer(request, context):  # noqa: ANN001, ANN202
                try:
                    return await inner(request, context)
                finally:
                    if writer.pending:
                        await writer.flush_async()
        else:
            def answer(request, context):  # noqa: ANN001, ANN202
                try:
                    return inner(request, context)
                finally:
                    writer.flush()

        return grpc.unary_unary_rpc_method_handler(
            answer, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def _settle(done: asyncio.Future, written: bool) -> None:
    if not done.done():
        done.set_result(written)
