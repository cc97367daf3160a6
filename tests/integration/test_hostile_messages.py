"""Hostile message bodies against a Worker on a real nsqd (docs/security.md)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import structlog

from nsqworker.errors import UndecodableBody
from nsqworker.nsq.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker


@pytest.fixture(autouse=True)
def quiet_logs() -> Any:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


async def test_msg_json_of_a_bad_body_dead_letters_at_once_without_backoff(
    nsqd: NsqdProcess,
) -> None:
    registry = Registry()
    letters: list[tuple[int, str]] = []
    handled: list[Any] = []

    def on_dead_letter(msg: Message, reason: str) -> None:
        letters.append((msg.attempts, reason))

    @registry.task("hostile", channel="c", max_attempts=5, on_dead_letter=on_dead_letter)
    async def handle(msg: Message) -> None:
        handled.append(msg.json())

    settings = Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], backoff_multiplier=1.0, requeue_delay=0.05
    )
    async with Worker(registry, settings):
        for _ in range(4):
            nsqd.publish("hostile", b"[" * 100_000)  # RecursionError in json.loads
        nsqd.publish("hostile", b"\xff not json")
        await wait_until(lambda: len(letters) == 5, message="5 dead letters")
        started = time.monotonic()
        nsqd.publish("hostile", b'{"ok": 1}')
        await wait_until(lambda: handled, timeout=10, message="the good message handled")
        assert time.monotonic() - started < 2.0  # a backoff level would pause 1 s, 2, 4...
    assert [attempts for attempts, _ in letters] == [1] * 5  # never retried
    assert sum("nested too deeply" in reason for _, reason in letters) == 4
    assert handled == [{"ok": 1}]


def test_undecodable_body_is_still_a_value_error() -> None:
    msg = Message(b"0" * 16, b"{", 0, 1, "t", "c", "127.0.0.1:4150")
    with pytest.raises(ValueError, match="body is not JSON"):
        msg.json()
    with pytest.raises(UndecodableBody):
        msg.json()
