"""``timeout_dead_letter_attempts`` on a real nsqd (issue 41): a message whose handler
keeps running past its time limit is dead-lettered instead of retried again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def quiet_logs() -> Any:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize("after", [0, 2])
async def test_an_async_handler_timing_out_twice_is_dead_lettered(
    nsqd: NsqdProcess, after: int
) -> None:
    registry = Registry()
    letters: list[tuple[int, str]] = []
    attempts: list[int] = []

    def on_dead_letter(msg: Message, reason: str) -> None:
        letters.append((msg.attempts, reason))

    @registry.task("slow", channel="c", timeout=0.2, max_attempts=3, on_dead_letter=on_dead_letter)
    async def handle(msg: Message) -> None:
        attempts.append(msg.attempts)
        await asyncio.sleep(60)

    settings = Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.05, backoff_multiplier=0,
        timeout_dead_letter_attempts=after,
    )  # fmt: skip
    async with Worker(registry, settings):
        nsqd.publish("slow", b"never done")
        await wait_until(lambda: letters, timeout=30, message="dead-lettered")
    if after:
        assert attempts == [1, 2]
        assert letters == [
            (2, "the handler ran past its time limit of 0.2s on attempt 2 "
                "(timeout_dead_letter_attempts 2: not retried)")
        ]  # fmt: skip
    else:  # retried until max_attempts, dead-lettered at the last one
        assert attempts == [1, 2, 3]
        assert letters == [(3, "max attempts exceeded")]
