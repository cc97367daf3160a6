"""The health server against clients that hold connections open (docs/security.md)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from nsqworker import health
from nsqworker.health import HealthServer, WorkerMetrics
from nsqworker.settings import Settings


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HealthServer]:
    monkeypatch.setattr(health._QuietHandler, "timeout", 1.0)
    with HealthServer("127.0.0.1", 0, lambda: True, lambda: (True, {}), WorkerMetrics()) as s:
        yield s


def livez(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as answer:
        return int(answer.status)


def test_half_sent_requests_neither_pile_up_threads_nor_last(server: HealthServer) -> None:
    before = threading.active_count()
    clients = []
    for _ in range(500):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # never finished
        clients.append(sock)
    time.sleep(0.3)
    assert threading.active_count() - before <= health.MAX_CONNECTIONS + 2
    time.sleep(1.5)  # past the request timeout: the server hangs up on each of them
    hung_up = 0
    for sock in clients:
        sock.settimeout(0.01)
        try:
            hung_up += sock.recv(100) == b""
        except TimeoutError:
            pass
        sock.close()
    assert hung_up >= 450  # the few left are being closed right now
    assert livez(server.port) == 200
    deadline = time.monotonic() + 5
    while threading.active_count() > before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before + 1


def test_health_binds_loopback_by_default() -> None:
    assert Settings().health_host == "127.0.0.1"
