"""What the fault tests share: a Worker in this process with fast settings, and a record
of what its handlers saw."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry

TOPIC = "faults"
CHANNEL = "c"


class Seen:
    """Bodies handled (with how often) and the attempts each delivery carried."""

    def __init__(self) -> None:
        self.bodies: Counter[str] = Counter()
        self.attempts: list[int] = []

    def add(self, msg: Message) -> None:
        self.bodies[msg.body.decode()] += 1
        self.attempts.append(msg.attempts)

    def missing(self, expected: list[str]) -> list[str]:
        return [b for b in expected if self.bodies[b] == 0]


def fast(**values: Any) -> Settings:
    """Settings for a fault test: quick reconnects and no consumer backoff."""
    base: dict[str, Any] = {
        "reconnect_delay": 0.05,
        "max_reconnect_delay": 0.3,
        "backoff_multiplier": 0.0,
        "retry_delay": 0.05,
        "drain_timeout": 2.0,
        "dial_timeout": 1.0,
        "health_port": 0,
    }
    base.update(values)
    return Settings(**base)


def recording_registry(
    seen: Seen, extra: Callable[[Message], Any] | None = None, topic: str = TOPIC
) -> Registry:
    """A registry whose one async task records every message it handles."""
    registry = Registry()

    @registry.task(topic, channel=CHANNEL, max_attempts=100, name="record")
    async def record(msg: Message) -> None:
        if extra is not None:
            result = extra(msg)
            if asyncio.iscoroutine(result):
                await result
        seen.add(msg)

    return registry


async def until(
    predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str]
) -> None:
    """Await ``predicate()`` truthy, polling; fail with ``what`` (or what it returns,
    built at the failure) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"{text} (waited {timeout:g} s)")
        await asyncio.sleep(0.05)


class Kit:
    """The helpers above, for tests (test modules here cannot import each other)."""

    Settings = Settings
    TOPIC = TOPIC
    CHANNEL = CHANNEL
    Seen = Seen
    fast = staticmethod(fast)
    registry = staticmethod(recording_registry)
    until = staticmethod(until)


@pytest.fixture
def kit() -> type[Kit]:
    """The fault tests' helpers."""
    return Kit


@pytest.fixture(autouse=True)
def _quiet_logs() -> Any:
    """A line per message would swamp the output of a failing test; warnings stay."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.configure(**saved)


@pytest.fixture(autouse=True)
def _fresh_negotiation() -> Any:
    """Each test starts with nothing learned about any nsqd."""
    from nsqworker.nsq.handshake import forget_adapted

    forget_adapted()
    yield


def _e2e_fixtures() -> Any:
    """tests/e2e/conftest.py's ``supervise`` and friends, shared without a package."""
    path = Path(__file__).parents[1] / "e2e" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_nsqworker_e2e_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_e2e = _e2e_fixtures()
supervise = _e2e.supervise
base_env = _e2e.base_env
write_module = _e2e.write_module
