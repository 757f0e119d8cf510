"""The launchers' port choice (lifeboat_cache/testing/child_process.py): a port the kernel hands to no socket
that did not name it, because the server binds it only seconds after we chose it."""

from __future__ import annotations

import socket

from lifeboat_cache.testing import child_process
from lifeboat_cache.testing.child_process import LOOPBACK, PORT_RANGE, free_loopback_port


def test_port_is_below_the_ephemeral_range_and_free() -> None:
    for _ in range(20):
        port = free_loopback_port()
        assert PORT_RANGE[0] <= port <= PORT_RANGE[1] < child_process.ephemeral_port_low()
        with socket.socket() as s:
            s.bind((LOOPBACK, port))  # free now


def test_a_taken_port_is_never_chosen() -> None:
    held = []
    try:
        for _ in range(30):
            s = socket.socket()
            s.bind((LOOPBACK, free_loopback_port()))
            s.listen()
            held.append(s)
        ports = [s.getsockname()[1] for s in held]
        assert len(set(ports)) == len(ports)
    finally:
        for s in held:
            s.close()


def test_a_tuned_ephemeral_range_falls_back_to_the_kernels_choice(monkeypatch) -> None:
    monkeypatch.setattr(child_process, "ephemeral_port_low", lambda: 1024)  # a range that leaves no room below it
    port = free_loopback_port()
    with socket.socket() as s:
        s.bind((LOOPBACK, port))
