"""Ports for replicas and daemons come from below the ephemeral range, so outgoing connections cannot take them
between the Local Scheduler's probe and the replica's bind."""

from __future__ import annotations

import socket

from notebookos.ports import allocation_range, free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low, high = allocation_range()
    assert 0 < low < high  # /proc gives the range on Linux
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(low <= p < high for p in ports), ports
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_handed_out():
    low, high = allocation_range()
    held = []
    try:
        # hold a block of the range; whatever is returned must not be one of the held ports
        for port in range(low, low + 200):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        for _ in range(20):
            assert not set(free_ports(3)) & taken
    finally:
        for s in held:
            s.close()


def test_excluded_ports_are_never_handed_out():
    # a replica's Raft port is promised before its ZMQ ports are drawn: none may repeat it
    low, high = allocation_range()
    excluded = set(range(low, high)) - set(range(low, low + 10))  # all but ten ports
    ports = free_ports(5, exclude=excluded)
    assert len(set(ports)) == 5
    assert not set(ports) & excluded, ports
