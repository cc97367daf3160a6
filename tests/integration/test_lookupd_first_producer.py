"""Discovery of a topic nobody has published yet: lookupd is polled sooner (1 s, doubling
up to the interval) and the worker says once that the topic has no producers yet."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from nsqworker.nsq.lookupd import LookupdPoller
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdFactory, NsqlookupdProcess
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration


async def test_poller_backs_off_from_one_second_while_there_are_no_producers(
    nsqlookupd: NsqlookupdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsqworker.nsq.lookupd")
    poller = LookupdPoller(
        [nsqlookupd.http_address], "never_published", lambda _: None, interval=10.0, jitter=0.0
    )
    try:
        assert await poller.poll() == set()
        assert [poller.next_wait() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
        await poller.poll()
    finally:
        await poller.close()
    told = [r.getMessage() for r in caplog.records if "no producers" in r.getMessage()]
    assert told == [
        "topic never_published has no producers in nsqlookupd yet (nobody has published to "
        "it); polling again in 1 s, doubling up to every 10 s"
    ]


async def test_poller_keeps_the_interval_once_producers_exist(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    nsqd = nsqd_factory(lookupd=nsqlookupd)
    nsqd.create_topic("published")
    poller = LookupdPoller(
        [nsqlookupd.http_address], "published", lambda _: None, interval=10.0, jitter=0.0
    )
    try:
        deadline = time.monotonic() + 10
        while not await poller.poll() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # nsqd registers the topic with lookupd asynchronously
        assert poller.last_producers == {nsqd.tcp_address}
        assert poller.next_wait() == 10.0
    finally:
        await poller.close()


async def test_first_message_on_a_new_topic_is_handled_within_seconds(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    nsqd = nsqd_factory(lookupd=nsqlookupd)
    handled = asyncio.Event()
    tasks = Registry()

    @tasks.task("brand_new", channel="c")
    async def handle(msg: object) -> None:
        handled.set()

    settings = Settings(lookupd_http_addresses=[nsqlookupd.http_address], health_port=0)
    assert settings.lookupd_poll_interval == 60  # the default: without fast polls, ~1 min
    async with Worker(tasks, settings) as worker:
        assert worker.ready  # lookupd answered: no nsqd has the topic yet, nothing to wait for
        await asyncio.sleep(0.5)
        started = time.monotonic()
        nsqd.publish("brand_new", b"first")
        await asyncio.wait_for(handled.wait(), 15)
        assert time.monotonic() - started < 15
