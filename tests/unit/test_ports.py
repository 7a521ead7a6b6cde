"""The ports the local brokers, clusters and Spark masters are given: free, and outside the kernel's
ephemeral range, so that a node killed and started again finds its ports (see ``free_ports``)."""

from __future__ import annotations

import socket

from controlmsg.clusters.processes import ephemeral_port_range, free_ports, port_free


def test_free_ports_are_free_consecutive_and_not_ephemeral() -> None:
    low, high = ephemeral_port_range()
    assert 1024 <= low <= high <= 65535
    for count in (1, 3):
        base = free_ports(count)
        ports = range(base, base + count)
        assert all(not low <= p <= high for p in ports)
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", base))  # free: a listener can take it
            a.listen()
            assert not port_free(base)
            if count > 1:
                b.bind(("127.0.0.1", base + count - 1))


def test_free_ports_leave_out_the_excluded() -> None:
    taken = {free_ports() for _ in range(20)}
    for _ in range(50):
        assert free_ports(exclude=taken) not in taken
