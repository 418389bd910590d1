"""Parsing the ``--peers`` argument: ``id=host:port`` pairs, comma-separated."""

from __future__ import annotations


def parse_address(address: str) -> str:
    """Validate ``host:port`` and return it unchanged."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")
    return address


def parse_peers(text: str) -> dict[int, str]:
    """``"2=127.0.0.1:7002,3=127.0.0.1:7003"`` -> ``{2: "127.0.0.1:7002", 3: ...}``."""
    peers: dict[int, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        rid, sep, address = item.partition("=")
        if not sep or not rid.strip().lstrip("-").isdigit():
            raise ValueError(f"--peers entry {item!r} is not id=host:port")
        replica_id = int(rid)
        if replica_id in peers:
            raise ValueError(f"--peers names replica {replica_id} twice")
        peers[replica_id] = parse_address(address.strip())
    return peers
