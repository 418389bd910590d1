"""Is a host's node gone, or only its Local Scheduler? Asked when the daemon's connection to the
Global Scheduler was closed or reset (``HostLink.on_reset``).

Both look the same on the daemon's own link ("Stream removed (Socket closed)"): a killed VM or
node container resets it as a daemon that exited does. They differ in the replicas: a daemon's
restart leaves them running (issue 33), so each still has its listening sockets and the node's
kernel accepts a TCP connection to them within a round trip, whatever the replica process is
doing (the kernel completes the handshake, not the process: a busy or stopped replica accepts
too). A lost node's replicas refuse (their processes and their sockets are gone, the node's
kernel answers a reset) or answer nothing (the node's address is gone). So the node is declared
lost when none of the host's replicas accepts a connection within a short deadline, and the
heartbeat timeout stays the backstop for what this cannot tell (a host without replicas, a
replica still starting).
"""

from __future__ import annotations

import errno
import selectors
import socket
import time

ACCEPTS = "accepts"
REFUSED = "refused"
UNREACHABLE = "unreachable"
NO_ANSWER = "no answer"


def probe_ports(addresses: list[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], str]:
    """Open a TCP connection to each (ip, port) at once and close it: ``ACCEPTS``, ``REFUSED``,
    ``UNREACHABLE`` (no route, the address gone) or ``NO_ANSWER`` within ``timeout_s``. Nothing is
    sent (a ZMQ socket drops a peer that closes before its greeting)."""
    results: dict[tuple[str, int], str] = {}
    sel = selectors.DefaultSelector()
    try:
        for address in dict.fromkeys(addresses):
            family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                code = sock.connect_ex(address)
            except OSError as exc:  # a name that does not resolve: no evidence either way
                results[address] = f"error {exc}"
                sock.close()
                continue
            if code in (0, errno.EINPROGRESS, errno.EAGAIN):
                sel.register(sock, selectors.EVENT_WRITE, address)
            else:
                results[address] = _outcome(code)
                sock.close()
        deadline = time.monotonic() + timeout_s
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                sock = key.fileobj
                results[key.data] = _outcome(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
                sel.unregister(sock)
                sock.close()
        for key in list(sel.get_map().values()):
            results[key.data] = NO_ANSWER
            sel.unregister(key.fileobj)
            key.fileobj.close()
    finally:
        sel.close()
    return results


def _outcome(code: int) -> str:
    if code == 0:
        return ACCEPTS
    if code == errno.ECONNREFUSED:
        return REFUSED
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.ETIMEDOUT):
        return UNREACHABLE
    return f"error {errno.errorcode.get(code, code)}"
