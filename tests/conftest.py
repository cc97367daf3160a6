"""Fixtures every test directory shares (the nsqd and kube fixtures are the
``nsqworker.testing`` plugin's, which users get too)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from nsqworker import logging as nsqworker_logging
from nsqworker.health import HealthServer, WorkerMetrics
from nsqworker.testing.ci import in_ci

# Property tests on a loaded 2-core CI machine: no per-example deadline (the default 200 ms
# fails a test for the machine's load, not for the code) and the same examples every run
# (a CI failure is reproducible; exploring new examples is what local runs do).
hypothesis_settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
if in_ci():
    hypothesis_settings.load_profile("ci")


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """JSON logging at info into a buffer, as an application that set up its own logging
    would have it; returns a reader of the lines so far."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setattr(nsqworker_logging, "_explicit", False)
    buffer = io.StringIO()
    nsqworker_logging.configure_logging("info", "json", stream=buffer)

    def read() -> list[dict[str, Any]]:
        return [json.loads(line) for line in buffer.getvalue().splitlines() if line]

    yield read
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


@pytest.fixture
def health() -> Iterator[Callable[[dict[str, Any], list[dict[str, Any]]], str]]:
    """``health(status, inflight)`` serves them from a real HealthServer (a worker's
    health port, as the console reads it); its URL."""
    servers: list[HealthServer] = []

    def start(doc: dict[str, Any], inflight: list[dict[str, Any]]) -> str:
        server = HealthServer(
            "127.0.0.1", 0, lambda: True, lambda: (True, {}), WorkerMetrics(),
            lambda: {"inflight": inflight}, lambda: doc,
        )  # fmt: skip
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.stop()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """Every async test runs on uvloop, the loop ``nsqworker run`` uses; tests marked
    ``both_loops`` run on the standard loop too, so a difference between the two (timers
    that fire early against ``time.monotonic``) can never hide again."""
    import asyncio

    import uvloop

    if item.get_closest_marker("both_loops") is not None:
        return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
    return {"uvloop": uvloop.new_event_loop}
