"""A worker whose ``/status`` is hostile or broken never takes the console down.

The console runs as ``python -m nsqworker console`` (uvicorn, its background read of the
fleet every 0.5 s), over one good worker (a real :class:`HealthServer`) and hostile ones:
real HTTP servers on 127.0.0.1 that answer with documents no ``nsqworker run`` sends
(an integer too large for a float, a list where a topic goes, JSON nested past Python's
recursion limit, an answer that never ends). Every page must answer 200 quickly, with
one error row per hostile worker (its URL and what was wrong) and the good worker's task.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nsqworker.admin.console.fleet import READ_TIMEOUT
from nsqworker.health import HealthServer, WorkerMetrics
from nsqworker.testing import free_port, wait_for

GOOD_STATUS = {
    "pid": 4242, "hostname": "pod-a", "target": "svc", "transport": "nsq", "uptime_s": 12.0,
    "memory_bytes": 50 * 2**20, "restarts": 0, "stopping": False,
    "workers": [{"worker": 1, "pid": 4243, "ready": True, "uptime_s": 11.0,
                 "memory_bytes": 60 * 2**20, "in_flight": 0}],
    "tasks": [{"task": "good.task", "topic": "orders", "channel": "c", "system": "nsq",
               "received": 3, "finished": 3, "requeued": 0, "dead_lettered": 0,
               "in_flight": 0, "subscribed": True, "dead_letter_topic": "orders.dead",
               "last_error": None}],
}  # fmt: skip

HUGE_AT = (
    b'{"tasks": [{"task": "huge.at", "topic": "t", "channel": "c", "last_error": '
    b'{"error": "E", "at": 1' + b"0" * 400 + b'}}], "workers": []}'
)
"""``last_error.at = 10**400``: valid JSON, an integer no float can hold."""
LIST_TOPIC = (
    b'{"tasks": [{"task": "list.dlt", "topic": "t", "channel": "c", '
    b'"dead_letter_topic": ["a", "b"]}], "workers": []}'
)
DEEP = b"[" * 100_000 + b"]" * 100_000
"""Nested past the JSON parser's recursion limit."""
EMPTY_INFLIGHT = b'{"inflight": []}'


class Hostile(http.server.BaseHTTPRequestHandler):
    """Answers ``/status`` with the server's ``status`` bytes (``None``: a body that
    trickles in a byte every 0.2 s and never ends) and ``/inflight`` with an empty list."""

    def do_GET(self) -> None:
        body = self.server.status if self.path == "/status" else EMPTY_INFLIGHT  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if body is None:
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(b"{")
                while not self.server.stopping.is_set():  # type: ignore[attr-defined]
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    self.server.stopping.wait(0.2)  # type: ignore[attr-defined]
            return
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hostile() -> Iterator[Callable[[bytes | None], str]]:
    """``hostile(status_bytes)`` serves them on 127.0.0.1; its URL."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: bytes | None) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
        server.daemon_threads = True
        server.status = status  # type: ignore[attr-defined]
        server.stopping = threading.Event()  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.stopping.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


@pytest.fixture
def good_worker() -> Iterator[str]:
    """A real health server of ``nsqworker run`` serving :data:`GOOD_STATUS`."""
    server = HealthServer(
        "127.0.0.1", 0, lambda: True, lambda: (True, {}), WorkerMetrics(),
        lambda: {"inflight": []}, lambda: GOOD_STATUS,
    )  # fmt: skip
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """``console(*args)`` runs ``python -m nsqworker console *args`` on a free port; its URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> str:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
        env["NSQWORKER_CONSOLE_POLL_INTERVAL"] = "0.5"
        log = (tmp_path / f"console-{port}.log").open("wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "nsqworker", "console", "--port", str(port), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url + "/livez"), 30, message="the console never started")
        return url

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # a console stuck on a hung page
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_hostile_status_documents_are_error_rows_not_a_dead_console(
    hostile: Callable[[bytes | None], str], good_worker: str, console: Callable[..., str]
) -> None:
    bad = {
        hostile(HUGE_AT): "tasks.0.last_error.at",
        hostile(LIST_TOPIC): "tasks.0.dead_letter_topic",
        hostile(DEEP): "not JSON",
        hostile(None): "no full answer within 3 s",
    }
    workers = [good_worker, *bad]
    url = console(*[arg for w in workers for arg in ("--worker", w)])

    # The first page waits for the first read of the fleet, which the never-ending
    # answer holds for READ_TIMEOUT (3 s); later pages render from memory at once.
    first = httpx.get(url + "/", timeout=READ_TIMEOUT + 2)
    assert first.status_code == 200

    def every_page_shows_everyone() -> bool:
        for path in ("/", "/?partial=1", "/workers", "/workers?partial=1"):
            started = time.monotonic()
            page = httpx.get(url + path, timeout=5)
            took = time.monotonic() - started
            assert page.status_code == 200, (path, page.status_code, page.text[:500])
            assert took < 1, f"{path} took {took:.2f} s"
            if path.startswith("/workers"):
                if f'data-url="{good_worker}"' not in page.text or "60.0 MiB" not in page.text:
                    return False
            elif 'data-task="good.task"' not in page.text:
                return False
            for worker, what in bad.items():
                rows = [line for line in page.text.splitlines() if "worker-error" in line]
                if not any(worker in row and what in row for row in rows):
                    return False
        return True

    wait_for(every_page_shows_everyone, 20, interval=0.2,
             message=lambda: httpx.get(url + "/", timeout=5).text)  # fmt: skip
    fleet = httpx.get(url + "/api/fleet", timeout=5).json()
    errors = {s["url"]: s["error"] for s in fleet["supervisors"]}
    assert errors[good_worker] is None
    assert "malformed /status: tasks.0.last_error.at" in errors[next(iter(bad))]
    assert [t["task"] for t in fleet["tasks"]] == ["good.task"]
