"""The Global Scheduler's gRPC server runs on the fronts' loop (issue 32): a ``grpc.aio`` server
whose I/O is driven by the loop that owns the kernel fronts (``FrontLoop.shared()``).

Two kinds of handler serve on it:

- coroutines (``async def``: ``Heartbeat``, ``ReportReplicaEvent``, ``GetKernelStatus``,
  ``ListKernels``, ``GetClusterStatus``, and the kernel life cycle, lifecycle.py) run on the
  loop itself. They take ``service.lock``
  with ``await lock.acquire_async()`` (state_lock.py: a thread holding it delays the call, not
  the loop) for a short decision, but never await while holding it (the lock is an RLock:
  another coroutine on the loop would enter it too), and whatever blocks (a Local Scheduler
  called, a sleep, a wait on a future) goes to an executor;
- a plain method (none is left: the host calls, ``RegisterHost``, ``DeregisterHost`` and
  ``DrainHost``, became coroutines too) would run in a thread pool, as before.
  ``SyncHandlersInPool`` runs it there (``loop.run_in_executor``, as grpc.aio's own
  ``migration_thread_pool`` would) with a ``SyncContext`` that keeps what the synchronous
  ``grpc.server`` gave a handler and grpc.aio's compatibility context does not
  (grpc ``_cygrpc/aio/server.pyx.pxi``, ``_SyncServicerContext``): ``is_active`` (a drain
  ends when its caller goes away), and ``add_callback`` that returns True and runs the
  callback once the answer is sent (grpc.aio's returns None and runs it before the answer
  is sent). ``abort`` is applied on the loop once the handler returned, as the synchronous
  server applied it after the handler (even one that swallowed the exception).

It also parses every unary request itself, so that the answers keep the synchronous server's
codes: a request that does not parse gets INTERNAL ("Exception deserializing request!"), a
handler that raises gets UNKNOWN ("Exception calling application: ..."); grpc.aio answers both
UNKNOWN ("Unexpected ...").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import grpc

log = logging.getLogger(__name__)


class Aborted(Exception):
    """Raised in a synchronous handler by ``SyncContext.abort`` (the synchronous server raised
    a bare ``Exception``); the call ends with the status given to ``abort``."""


class SyncContext:
    """A ``grpc.ServicerContext`` for a synchronous handler run in the pool, over the call's
    ``grpc.aio`` context. Only the calls that touch no I/O are passed on from the pool
    thread; ``abort`` is recorded and applied on the loop."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.aborted: tuple[grpc.StatusCode, str] | None = None
        self.callbacks: list[Callable[[], None]] = []
        self._ended = threading.Event()

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        if self.aborted is None:
            self.aborted = (code, details)
        raise Aborted(details)

    def abort_with_status(self, status: grpc.Status) -> None:
        self.abort(status.code, status.details)

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (on the loop: it must be quick) once the call ended, its answer
        sent; False when it has ended already."""
        if self._ended.is_set():
            return False
        self.callbacks.append(callback)
        return True

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def ended(self) -> None:
        """On the loop: the call ended (answered, or cancelled by its client)."""
        self._ended.set()
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one callback's failure must not skip the others
                log.exception("a gRPC call's callback failed")

    def peer(self) -> str:
        return self._context.peer()

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._context.set_code(code)

    def set_details(self, details: str) -> None:
        self._context.set_details(details)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._context.set_trailing_metadata(metadata)


def is_async(behaviour: Any) -> bool:
    """Whether grpc.aio runs this handler on the loop (as ``_is_async_handler`` decides)."""
    return asyncio.iscoroutinefunction(behaviour)


async def _parse(deserialize: Callable[[bytes], Any] | None, raw: bytes,
                 context: grpc.aio.ServicerContext) -> Any:
    if deserialize is None:
        return raw
    try:
        return deserialize(raw)
    except Exception as exc:  # noqa: BLE001 - answered as the synchronous server did
        log.warning("Exception deserializing request! (%s)", exc)
        await context.abort(grpc.StatusCode.INTERNAL, "Exception deserializing request!")


class SyncHandlersInPool(grpc.aio.ServerInterceptor):
    """Runs each synchronous unary handler in ``pool`` with a ``SyncContext``; coroutine
    handlers are left to run on the loop. Both get their request parsed here (see above)."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool

    async def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner, pool, deserialize = handler.unary_unary, self._pool, handler.request_deserializer
        if is_async(inner):
            async def answer_async(raw, context):  # noqa: ANN001, ANN202
                return await inner(await _parse(deserialize, raw, context), context)

            return grpc.unary_unary_rpc_method_handler(
                answer_async, response_serializer=handler.response_serializer)

        async def answer(raw, context):  # noqa: ANN001, ANN202
            request = await _parse(deserialize, raw, context)
            sync = SyncContext(context)
            context.add_done_callback(lambda _: sync.ended())
            loop = asyncio.get_running_loop()
            try:
                response = await loop.run_in_executor(
                    pool, functools.partial(inner, request, sync))
            except asyncio.CancelledError:
                sync.ended()  # the client went away: is_active() says so to the handler
                raise
            except Aborted:
                response = None
            except Exception as exc:
                if sync.aborted is None:  # as the synchronous server answered it
                    log.exception("Exception calling application: %s", exc)
                    sync.aborted = (grpc.StatusCode.UNKNOWN,
                                    f"Exception calling application: {exc}")
                response = None
            if sync.aborted is not None:
                await context.abort(*sync.aborted)
            return response

        return grpc.unary_unary_rpc_method_handler(
            answer, response_serializer=handler.response_serializer)
