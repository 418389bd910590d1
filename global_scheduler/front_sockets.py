"""The five client-facing sockets of a kernel's front, bound; and one such set kept bound ahead.

Drawing five free ports (each claimed among this machine's processes, ``notebookos.ports``) and
binding five ZMQ sockets costs ~1.3 ms, on the StartKernel path of every kernel, under the
Global Scheduler's lock for part of it. ``SpareFrontSockets`` keeps one set bound for the next
kernel and binds the following one on a worker thread once it is taken. The sockets hold nothing
kernel-specific until a front adopts them (their options are the same for every kernel).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from notebookos.backlog import DEFAULT_MAX_MESSAGES
from notebookos.ports import free_ports

log = logging.getLogger(__name__)

FRONT_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
SOCKET_KINDS = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER,
                "iopub": zmq.XPUB, "hb": zmq.REP}
BIND_ATTEMPTS = 5
# IOPub's send high-water mark: a front's held backlog goes out in one burst on subscription
IOPUB_HWM = max(1000, DEFAULT_MAX_MESSAGES)


class FrontSockets:
    """The sockets, bound on ``ports`` (a restart re-binds the ports a kernel's clients know),
    else on ports drawn below the kernel's ephemeral range (``notebookos.ports``): a port the OS
    hands out for port 0 is free again while the Global Scheduler is down, and a restarted daemon
    binding port 0 (its metrics server) or any outgoing connection could take it, leaving the
    kernel without its front. Raises zmq.ZMQError when they cannot be bound."""

    def __init__(self, ip: str, ports: dict[str, int] | None = None) -> None:
        self.ip = ip
        self.sockets: dict[str, zmq.Socket] = {}
        self.ports: dict[str, int] = {}
        if ports:
            self._bind_on(ports)
            return
        for attempt in range(BIND_ATTEMPTS):
            drawn = dict(zip((f"{name}_port" for name in FRONT_CHANNELS),
                             free_ports(len(FRONT_CHANNELS), ip), strict=True))
            try:
                self._bind_on(drawn)
                return
            except zmq.ZMQError as exc:  # taken between the draw and the bind: draw again
                if exc.errno != zmq.EADDRINUSE or attempt == BIND_ATTEMPTS - 1:
                    raise

    def _bind_on(self, ports: dict[str, int]) -> None:
        context = zmq.Context.instance()
        self.sockets, self.ports = {}, {}
        try:
            for name in FRONT_CHANNELS:
                sock = context.socket(SOCKET_KINDS[name])
                sock.linger = 0
                if name in ("shell", "control", "stdin"):
                    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
                if name == "iopub":
                    sock.sndhwm = IOPUB_HWM
                    sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription
                port = ports[f"{name}_port"]
                self.sockets[name] = sock
                sock.bind(f"tcp://{self.ip}:{port}")
                self.ports[f"{name}_port"] = port
        except zmq.ZMQError:
            self.close()
            raise

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


class SpareFrontSockets:
    """One set of front sockets bound ahead of the kernel that takes it. ``take()`` hands it
    over (None while none is ready: the front binds its own) and has the next one bound by
    ``submit`` (a worker pool's). A set that cannot be bound is logged; the next take tries
    again."""

    def __init__(self, ip: str, submit: Callable[[Callable[[], None]], object]) -> None:
        self.ip = ip
        self._submit = submit
        self._lock = threading.Lock()
        self._spare: FrontSockets | None = None
        self._binding = False
        self._closed = False

    def prepare(self) -> None:
        """Have a spare bound (on the worker), unless one is there or on its way."""
        with self._lock:
            if self._closed or self._binding or self._spare is not None:
                return
            self._binding = True
        try:
            self._submit(self._bind_spare)
        except RuntimeError:  # the worker pool is shut down: the daemon is stopping
            with self._lock:
                self._binding = False

    def take(self) -> FrontSockets | None:
        with self._lock:
            spare, self._spare = self._spare, None
        self.prepare()
        return spare

    def _bind_spare(self) -> None:
        try:
            sockets: FrontSockets | None = FrontSockets(self.ip)
        except (zmq.ZMQError, OSError) as exc:
            log.warning("could not bind a spare kernel front on %s: %s", self.ip, exc)
            sockets = None
        with self._lock:
            self._binding = False
            if not self._closed and self._spare is None:
                self._spare, sockets = sockets, None
        if sockets is not None:  # closed meanwhile
            sockets.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
