"""free_port never hands the same port out twice in one process."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from replicator.devstack import processes
from replicator.devstack.processes import free_port


def test_a_port_the_kernel_gives_again_is_not_handed_out_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel may return one ephemeral port to two binds in a row (seen in CI: a broker's
    # client and controller listeners on one port). Simulate it: the first two binds get 40001.
    given = iter([40001, 40001, 40002])

    class Socket(socket.socket):
        def getsockname(self) -> Any:
            return ("127.0.0.1", next(given))

    monkeypatch.setattr(socket, "socket", Socket)
    monkeypatch.setattr(processes, "_handed_out", set())
    assert free_port() == 40001
    assert free_port() == 40002


def test_ports_are_distinct_over_many_calls() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
