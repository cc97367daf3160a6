"""A standby of a channel's single active consumer says so (issue 39: it said only
"worker started"), and says it is active when it takes over."""

from __future__ import annotations

import logging
import uuid

import pytest

from nsqworker import Registry, Settings, Worker
from nsqworker.testing import wait_until


def settings(uri: str) -> Settings:
    return Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri, drain_timeout=5.0,
                    client_id="standby-test")  # fmt: skip


async def test_a_standby_says_for_which_channel_and_stream_and_then_takes_over(
    rabbitmq: str, caplog: pytest.LogCaptureFixture
) -> None:
    stream = f"standby_{uuid.uuid4().hex[:8]}"
    registry = Registry()

    @registry.task(stream, channel="ledger")
    async def handle(msg: object) -> None: ...

    caplog.set_level(logging.INFO, logger="nsqworker.streams")
    lines = lambda: [r.getMessage() for r in caplog.records]  # noqa: E731
    first = Worker(registry, settings(rabbitmq))
    await first.__aenter__()
    try:
        await wait_until(lambda: any(f"active on {stream} " in m for m in lines()), 20,
                         lambda: f"the first never became active: {lines()}")  # fmt: skip
        async with Worker(registry, settings(rabbitmq)):
            standby = f"standing by for ledger on {stream}; the active consumer is another"
            said = await wait_until(
                lambda: [m for m in lines() if standby in m], 20, lambda: f"{lines()}"
            )
            assert len(said) == 1, said  # once, not per check
            assert f"--stream {stream} --reference ledger" in said[0]
            assert "this one as 'nsqworker standby-test'" in said[0]
            active_before = sum(f"active on {stream} " in m for m in lines())
            await first.__aexit__(None, None, None)
            first = None
            await wait_until(
                lambda: sum(f"active on {stream} " in m for m in lines()) > active_before, 20,
                lambda: f"the standby never took over: {lines()}",
            )  # fmt: skip
    finally:
        if first is not None:
            await first.__aexit__(None, None, None)
