"""The cluster join token: what a Local Scheduler presents, on top of its certificate, for the
Global Scheduler to take its registration, heartbeats and replica events.

The token travels as call metadata (``notebookos-join-token``) inside the TLS connection. The
Global Scheduler checks it in a server interceptor (``JoinTokenInterceptor`` for a
``grpc.Server``, ``AioJoinTokenInterceptor`` for a ``grpc.aio.Server``) on the methods only Local
Schedulers call (``HOST_METHODS``); a missing or wrong token gets UNAUTHENTICATED with a message
that names the settings to check, never the token. The token file may hold several tokens, one
per line: the Global Scheduler accepts any of them and a Local Scheduler presents the first, which
is how a token is rotated without stopping anything (docs/security.md). The file is re-read
when it changes.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from notebookos.config import Config
from notebookos.security.files import SecurityError, credential_files

log = logging.getLogger(__name__)

METADATA_KEY = "notebookos-join-token"
GS_SERVICE = "/notebookos.v1.GlobalScheduler/"
HOST_METHODS = frozenset(GS_SERVICE + m for m in (
    "RegisterHost", "Heartbeat", "DeregisterHost", "DrainHost", "ReportReplicaEvent"))
SETTINGS_HINT = ("security.join_token_file ($NOTEBOOKOS_SECURITY_JOIN_TOKEN_FILE) or "
                 "security.join_token ($NOTEBOOKOS_SECURITY_JOIN_TOKEN)")


class JoinTokens:
    """The token(s) of ``config``: from ``security.join_token``, else its token file (re-read
    when the file changes)."""

    def __init__(self, config: Config) -> None:
        self._value = config.security.join_token
        self._path: Path = credential_files(config).token
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._tokens: list[str] = []

    def _load(self) -> list[str]:
        if self._value:
            return [self._value]
        try:
            st = self._path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            raise SecurityError(f"no cluster join token file at {self._path} (setting "
                                f"{SETTINGS_HINT})") from None
        except OSError as exc:
            raise SecurityError(f"cannot read the join token file {self._path} (setting "
                                f"{SETTINGS_HINT}): {exc.strerror}") from None
        with self._lock:
            if stamp != self._stamp:
                try:
                    text = self._path.read_text()
                except OSError as exc:
                    raise SecurityError(f"cannot read the join token file {self._path} "
                                        f"(setting {SETTINGS_HINT}): {exc.strerror}") from None
                tokens = [line.strip() for line in text.splitlines()
                          if line.strip() and not line.lstrip().startswith("#")]
                if not tokens:
                    raise SecurityError(f"the join token file {self._path} (setting "
                                        f"{SETTINGS_HINT}) holds no token")
                self._tokens, self._stamp = tokens, stamp
            return list(self._tokens)

    def check(self) -> None:
        """Raise ``SecurityError`` now if there is no usable token."""
        self._load()

    def presented(self) -> str:
        return self._load()[0]

    def accepts(self, token: str | None) -> bool:
        if not token:
            return False
        given = token.encode()
        # compare with every token (no early exit: the time taken says nothing)
        return sum(hmac.compare_digest(given, t.encode()) for t in self._load()) > 0

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata that carries the token (for a Local Scheduler's calls)."""
        return ((METADATA_KEY, self.presented()),)


def _presented(details: grpc.HandlerCallDetails) -> str | None:
    for key, value in details.invocation_metadata or ():
        if key == METADATA_KEY:
            return value if isinstance(value, str) else None
    return None


def refusal(method: str, token: str | None) -> str:
    name = method.rpartition("/")[2]
    if not token:
        return (f"{name} refused: no cluster join token was presented. A Local Scheduler must "
                f"present the Global Scheduler's join token: set {SETTINGS_HINT} on it")
    return (f"{name} refused: the cluster join token presented is not the Global Scheduler's. "
            f"Check {SETTINGS_HINT} on this Local Scheduler against the Global Scheduler's")


class _Gate:
    def __init__(self, tokens: JoinTokens, methods: frozenset[str]) -> None:
        self.tokens = tokens
        self.methods = methods

    def verdict(self, details: grpc.HandlerCallDetails) -> str | None:
        """None when the call may go on, else why not."""
        if details.method not in self.methods:
            return None
        token = _presented(details)
        try:
            if self.tokens.accepts(token):
                return None
        except SecurityError as exc:
            log.error("cannot check a join token: %s", exc)
            return (f"{details.method.rpartition('/')[2]} refused: the Global Scheduler has "
                    "no usable join token (see its log)")
        return refusal(details.method, token)


class JoinTokenInterceptor(grpc.ServerInterceptor):
    """For a ``grpc.Server``: ``grpc.server(pool, interceptors=[JoinTokenInterceptor(config)])``."""

    def __init__(self, config: Config, methods: frozenset[str] = HOST_METHODS) -> None:
        self._gate = _Gate(JoinTokens(config), methods)
        self._gate.tokens.check()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        why = self._gate.verdict(handler_call_details)
        if why is None:
            return continuation(handler_call_details)

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            log.warning("refused %s from %s: join token missing or wrong",
                        handler_call_details.method, context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        return grpc.unary_unary_rpc_method_handler(deny)


class AioJoinTokenInterceptor(grpc.aio.ServerInterceptor):
    """For a ``grpc.aio.Server``: ``grpc.aio.server(interceptors=[AioJoinTokenInterceptor(c)])``."""

    def __init__(self, config: Config, methods: frozenset[str] = HOST_METHODS) -> None:
        self._gate = _Gate(JoinTokens(config), methods)
        self._gate.tokens.check()

    async def intercept_service(self, continuation: Any,
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        why = self._gate.verdict(handler_call_details)
        if why is None:
            return await continuation(handler_call_details)

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            log.warning("refused %s from %s: join token missing or wrong",
                        handler_call_details.method, context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        return grpc.unary_unary_rpc_method_handler(deny)
