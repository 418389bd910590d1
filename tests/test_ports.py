"""Ports for replicas and daemons come from below the ephemeral range, so outgoing connections cannot take them
between the Local Scheduler's probe and the replica's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from notebookos.ports import allocation_range, free_ports, raft_port, raft_port_range


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


def test_raft_ports_have_a_range_of_their_own_below_the_ephemeral_range():
    # the Global Scheduler names a new group's Raft ports without probing the replicas' hosts:
    # no prober (free_ports) may draw there, nor outgoing connections (the ephemeral range)
    low, high = allocation_range()
    raft_low, raft_high = raft_port_range()
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert low < high <= raft_low < raft_high <= ephemeral_low
    taken = set(range(raft_low, raft_high)) - {raft_low + 7}
    assert raft_port(taken) == raft_low + 7
    assert all(raft_low <= raft_port() < raft_high for _ in range(100))


def test_a_port_drawn_by_one_process_is_not_drawn_by_another_for_a_while() -> None:
    """Several Local Schedulers of one machine probe at the same moment: without a claim two of
    them could find the same port free and give it to two replicas (one then died at start
    with "address already in use", seen in the full suite)."""
    import subprocess
    import sys

    code = "from notebookos.ports import free_ports; print(*free_ports(300))"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60) for _ in range(2)]
    first, second = ({int(p) for p in run.stdout.split()} for run in runs)
    assert len(first) == len(second) == 300
    assert not first & second


def test_an_address_of_another_machine_is_refused_not_probed_forever() -> None:
    with pytest.raises(OSError, match="192.0.2.1"):  # TEST-NET-1: never this machine's
        free_ports(2, "192.0.2.1")
