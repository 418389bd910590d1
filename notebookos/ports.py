"""Free TCP ports for replica sockets (bound and released at once; the replica binds them next).

The ports are drawn from below the kernel's ephemeral range (``ip_local_port_range``), not by
binding port 0: a port the OS hands out from the ephemeral range can be taken in the moment
between this probe and the replica's bind by any outgoing connection on the host (gRPC, Raft and
ZMQ open many), and the replica then dies with "address already in use". Outside that range
only another prober could take it, and random draws make that rare.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000


def allocation_range() -> tuple[int, int]:
    """[low, high) of the ports to draw from: below the ephemeral range where it is known."""
    try:
        ephemeral_low = int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32_768
    if ephemeral_low - LOWEST < 1_000:  # an unusual ephemeral range: fall back to the OS
        return 0, 0
    return LOWEST, ephemeral_low


def free_ports(
    count: int, host: str = "127.0.0.1", exclude: Collection[int] = ()
) -> list[int]:
    """``count`` distinct free ports on ``host``; held open together so none repeats, and none
    of ``exclude`` (ports already promised to the same process but not bound yet)."""
    low, high = allocation_range()
    sockets: list[socket.socket] = []
    try:
        tries = 0
        while len(sockets) < count:
            tries += 1
            port = random.randrange(low, high) if high and tries <= 50 * count else 0
            if port in exclude:
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
