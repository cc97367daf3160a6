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
from nsqworker.testing.holds import window


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HealthServer]:
    monkeypatch.setattr(health, "REQUEST_TIMEOUT", 1.0)
    with HealthServer("127.0.0.1", 0, lambda: True, lambda: (True, {}), WorkerMetrics()) as s:
        yield s


def livez(port: int, timeout: float = 5) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=timeout) as answer:
        return int(answer.status)


def count_hung_up(clients: list[socket.socket], wait: float) -> int:
    """How many of ``clients`` the server has closed (each waited on ``wait`` s);
    closes them all."""
    hung_up = 0
    for sock in clients:
        sock.settimeout(wait)
        try:
            hung_up += sock.recv(100) == b""
        except TimeoutError:
            pass
        sock.close()
    return hung_up


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
    assert count_hung_up(clients, 0.01) >= 450  # the few left are being closed right now
    assert livez(server.port) == 200
    deadline = time.monotonic() + 5
    while threading.active_count() > before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before + 1


def trickle(port: int, source: str, stop: threading.Event, cut: list[float]) -> None:
    """A slowloris peer: keeps 80 connections open from ``source``, each sending one
    byte of a request every 0.2 s (well inside the per-read timeout), and opens a new
    one whenever the server hangs up; ``cut`` gets, for each admitted one, how long it
    was last seen open (a loaded machine makes the peer late to notice a hang-up, never
    the server late to make one: so the time it was last seen open, not noticed closed)."""
    open_: dict[socket.socket, tuple[float, float]] = {}  # -> (opened, last seen open)
    while not stop.is_set():
        while len(open_) < 80:
            sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
            sock.setblocking(False)
            open_[sock] = (time.monotonic(), time.monotonic())
        for sock, (since, seen) in list(open_.items()):
            try:
                sock.sendall(b"G")
                ended = sock.recv(100) == b""
            except BlockingIOError:
                ended = False
            except OSError:
                ended = True
            if ended:
                if time.monotonic() - since > 0.5:  # admitted (the refused: closed at once)
                    cut.append(seen - since)
                sock.close()
                del open_[sock]
            else:
                open_[sock] = (since, time.monotonic())
        time.sleep(0.2)
    for sock in open_:
        sock.close()


def test_a_trickling_peer_neither_starves_livez_nor_keeps_its_connections(
    server: HealthServer,
) -> None:
    """Each connection of one peer sends a byte every 0.2 s, so a timeout per read
    never fires; 80 of them from 127.0.0.2, reopened as they are cut. The peer gets
    MAX_PER_PEER connections, each cut at the deadline after its accept, and /livez
    from another address answers within a second all along."""
    stop, cut = threading.Event(), []
    attacker = threading.Thread(target=trickle, args=(server.port, "127.0.0.2", stop, cut))
    attacker.start()
    try:
        took = []
        end = time.monotonic() + 4  # four deadlines of 1 s
        while time.monotonic() < end:
            started = time.monotonic()
            assert livez(server.port, timeout=window(1.0)) == 200
            took.append(time.monotonic() - started)
            time.sleep(0.2)
    finally:
        stop.set()
        attacker.join()
    assert max(took) < window(1.0)
    assert len(cut) >= health.MAX_PER_PEER  # each admitted one was hung up on
    # the deadline, not the reads, ended each: none seen open half a second past it
    assert max(cut) < window(1.0 + 0.5)


def test_one_peer_cannot_hold_more_than_its_share(server: HealthServer) -> None:
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    time.sleep(0.3)
    assert count_hung_up(held, 0.05) == 20 - health.MAX_PER_PEER


def test_health_binds_loopback_by_default() -> None:
    assert Settings().health_host == "127.0.0.1"
