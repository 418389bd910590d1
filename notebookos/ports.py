"""Free TCP ports for replica sockets (bound and released at once; the replica binds them next).

The ports are drawn from below the kernel's ephemeral range (``ip_local_port_range``), not by
binding port 0: a port the OS hands out from the ephemeral range can be taken in the moment
between this probe and the replica's bind by any outgoing connection on the host (gRPC, Raft and
ZMQ open many), and the replica then dies with "address already in use". Outside that range
only another prober could take it, and random draws make that rare.

The range below the ephemeral one is split in two. ``free_ports`` (replica ZMQ sockets, daemons,
test servers) draws from the lower half. The upper half is for the Raft ports the Global
Scheduler names for a new group's replicas (``raft_port``): their peers must know those addresses
before the replicas start, so they cannot be probed on the replica's host; drawn where nothing else
draws, and never one the Global Scheduler already gave a live replica of that host, they are free
unless a foreign process took them.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000


def _ephemeral_low() -> int:
    try:
        return int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _split(ephemeral_low: int) -> int:
    return LOWEST + (ephemeral_low - LOWEST) // 2


def allocation_range() -> tuple[int, int]:
    """[low, high) of the ports ``free_ports`` draws from: the lower half of the ports below the
    ephemeral range where it is known; (0, 0) (the OS picks) where that is too small."""
    ephemeral_low = _ephemeral_low()
    if ephemeral_low - LOWEST < 2_000:  # an unusual ephemeral range: fall back to the OS
        return 0, 0
    return LOWEST, _split(ephemeral_low)


def raft_port_range() -> tuple[int, int]:
    """[low, high) of the Raft ports a Global Scheduler names for a new group: the upper half
    below the ephemeral range (no prober draws there), or 20000-59999 where that is too small."""
    ephemeral_low = _ephemeral_low()
    if ephemeral_low - LOWEST < 2_000:
        return 20_000, 60_000
    return _split(ephemeral_low), ephemeral_low


def raft_port(taken: Collection[int] = ()) -> int:
    """A port of ``raft_port_range`` that is not one of ``taken`` (the Raft ports of the replicas
    already on that host, and those drawn for the same group)."""
    low, high = raft_port_range()
    for _ in range(100):
        port = random.randrange(low, high)
        if port not in taken:
            return port
    left = [p for p in range(low, high) if p not in taken]
    if left:
        return random.choice(left)
    raise RuntimeError(f"no Raft port left in [{low}, {high}) outside {len(taken)} taken ones")


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (as Raft does: SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


CLAIMS = Path(tempfile.gettempdir()) / "notebookos-port-claims"
CLAIM_S = 30.0  # long enough for a process to start and bind what it was promised


def _claim(port: int) -> bool:
    """Claim ``port`` for CLAIM_S seconds among the processes of this machine: several
    probers (the Local Schedulers of a local cluster, test fixtures) drawing at the same moment
    could otherwise both find a port free and hand it to two processes, one of which then dies
    with "address already in use". A claim older than CLAIM_S is taken over."""
    try:
        CLAIMS.mkdir(exist_ok=True)
        path = CLAIMS / str(port)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if time.time() - path.stat().st_mtime < CLAIM_S:
                return False
            os.utime(path)  # a stale claim: take it over
            return True
        os.close(fd)
        return True
    except OSError:  # no usable temporary directory: the bind probe alone decides
        return True


def free_ports(
    count: int, host: str = "127.0.0.1", exclude: Collection[int] = ()
) -> list[int]:
    """``count`` distinct free ports on ``host``; held open together so none repeats, and none
    of ``exclude`` (ports already promised to the same process but not bound yet), nor one
    another process of this machine drew in the last CLAIM_S seconds. Raises OSError when
    ``host`` takes no port at all (not an address of this machine)."""
    low, high = allocation_range()
    sockets: list[socket.socket] = []
    try:
        tries = 0
        while len(sockets) < count:
            tries += 1
            if tries > 60 * count:
                raise OSError(f"cannot bind {count} port(s) on {host}: is it an address of "
                              "this machine?")
            port = random.randrange(low, high) if high and tries <= 50 * count else 0
            if port in exclude or (port and not _claim(port)):
                continue
            s = socket.socket()
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            if s.getsockname()[1] in exclude:  # the OS's own pick (port 0) can repeat one too
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
