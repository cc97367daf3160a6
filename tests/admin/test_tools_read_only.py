"""Reading never changes a broker, and dead letters are kept for the tools from the
first: the console reads only the dead-letter topics its workers' tasks declare (a page
view names no other topic into being, nor a channel on a live one, nor a NATS ``$KV``
subject); the worker makes the tools' NSQ channel when it starts, so an alerting task
already reading the dead-letter topic hides nothing; a Streams listing stops at its
limit; the console runs at most two listings at once. Each is asked of the broker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from nsqworker import Message, Registry, Reject, Worker
from nsqworker.admin import list_dead_letters
from nsqworker.admin.console.actions import MAX_LISTINGS
from nsqworker.admin.console.app import create_app
from nsqworker.admin.console.discovery import StaticWorkers
from nsqworker.admin.console.fleet import Fleet
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.nsq.transport import DEAD_LETTER_CHANNEL
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, make_message, wait_until

if TYPE_CHECKING:
    from conftest import Broker  # tests/admin/conftest.py

ORIGIN = "http://127.0.0.1:8081"
TOKEN = "s3cret-console-token-1234"


def status(system: str, topic: str, dead: str) -> dict[str, Any]:
    """A worker's /status with one task reading ``topic`` and dead-lettering to ``dead``."""
    return {
        "pid": 1, "hostname": "pod-a", "target": "svc", "transport": system, "uptime_s": 1.0,
        "memory_bytes": 1, "restarts": 0, "stopping": False, "workers": [],
        "tasks": [{"task": "svc.bill", "topic": topic, "channel": "billing",
                   "system": system, "received": 0, "finished": 0, "requeued": 0,
                   "dead_lettered": 0, "in_flight": 0, "subscribed": True,
                   "dead_letter_topic": dead, "last_error": None}],
    }  # fmt: skip


@contextlib.asynccontextmanager
async def console(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    fleet = Fleet(StaticWorkers(list(settings.console_workers)), None, 0.2)
    transport = httpx.ASGITransport(create_app(settings, fleet))
    try:
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN, timeout=60) as web:
            yield web
    finally:
        await fleet.close()


async def test_a_page_view_creates_no_topic_and_no_channel_on_nsq(
    default_ports_nsqd: NsqdFactory, health: Any
) -> None:
    nsqd = default_ports_nsqd()
    nsqd.mpublish("orders", [b'{"order": %d}' % i for i in range(3)])  # no consumer yet
    url = health(status("nsq", "orders", "orders.dead"), [])
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], console_workers=[url],
                        console_token=TOKEN, log_level="warning")  # fmt: skip
    async with console(settings) as web:
        for topic in ("orders", "brand_new", "orders.dead"):
            page = await web.get("/dead-letters", params={"topic": topic})
            assert page.status_code == 200
            if topic != "orders.dead":
                assert "is not a dead-letter topic of the workers&#39; tasks" in page.text
        replay = await web.post(
            "/api/dead-letters/replay", json={"topic": "orders", "all": True},
            headers={"authorization": f"Bearer {TOKEN}"},
        )  # fmt: skip
        assert replay.status_code == 400 and "not a dead-letter topic" in replay.json()["error"]
    orders = nsqd.topic_stats("orders")
    assert orders is not None and orders["channels"] == [] and orders["depth"] == 3
    assert nsqd.topic_stats("brand_new") is None
    assert nsqd.topic_stats("orders.dead") is None  # declared, but nothing made it yet


async def test_a_page_view_never_reads_a_reserved_nats_subject(
    nats_server: Any, health: Any
) -> None:
    import nats

    client = await nats.connect(nats_server.url)
    kv = await client.jetstream().create_key_value(bucket="secrets")
    await kv.put("db", b"password-hunter2")
    url = health(status("nats", "orders.created", "orders.dead"), [])
    settings = Settings(transport="nats", nats_servers=[nats_server.url],
                        console_workers=[url], log_level="warning")  # fmt: skip
    try:
        async with console(settings) as web:
            for topic in ("$KV.secrets.db", "$KV.secrets.>"):
                page = await web.get("/dead-letters", params={"topic": topic})
                assert page.status_code == 200 and "hunter2" not in page.text
                assert "is not a dead-letter topic" in page.text
        with pytest.raises(Exception, match="reserved NATS subject"):
            await list_dead_letters(settings, "$KV.secrets.db")
    finally:
        await client.close()


async def test_the_worker_keeps_nsq_dead_letters_for_the_tools_from_its_start(
    default_ports_nsqd: NsqdFactory,
) -> None:
    """An alerting task reads ``orders.dead`` on its own channel before the worker ever
    ran: the tools still see every dead letter, because the worker made their channel
    when it started, before its first dead letter."""
    nsqd = default_ports_nsqd()
    nsqd.create_channel("orders.dead", "alerting")
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], log_level="warning",
                        health_port=0, retry_delay=0.05)  # fmt: skip
    reg = Registry()

    @reg.task("orders", channel="billing", max_attempts=1, dead_letter_topic="orders.dead")
    async def bill(msg: Message) -> None:
        raise Reject("no invoice")

    async with Worker(reg, settings):
        await wait_until(
            lambda: nsqd.channel_stats("orders.dead", DEAD_LETTER_CHANNEL) is not None,
            timeout=10, message="the tools' channel, made at start",
        )  # fmt: skip
        nsqd.mpublish("orders", [b"1", b"2"])
        await wait_until(
            lambda: (nsqd.channel_stats("orders.dead", "alerting") or {}).get("depth") == 2,
            timeout=30, message="both dead letters",
        )  # fmt: skip
    letters = await list_dead_letters(settings, "orders.dead")
    assert sorted(d.body for d in letters if d.body is not None) == [b"1", b"2"]


async def test_a_streams_listing_stops_at_its_limit(broker: Broker) -> None:
    if broker.name != "rabbitmq-stream":
        return  # NSQ and NATS read only what they list (NATS by sequence; NSQ RDY-bound)
    envelope = dead_letter_envelope(make_message(body=b"x", topic=broker.topic), "r", "t")
    for _ in range(10):
        await broker.publish(broker.dead, [envelope] * 2000)
    started = time.monotonic()
    letters = await list_dead_letters(broker.settings(), broker.dead, limit=10, quiet=30.0)
    assert len(letters) == 10
    # Past its limit the read ends at once; reading all 20,000 would end only after 30 s
    # with nothing new (quiet).
    assert time.monotonic() - started < 20


async def test_the_console_runs_two_listings_at_once_and_one_per_topic(
    default_ports_nsqd: NsqdFactory, health: Any
) -> None:
    """Nine page views of three topics at once: each sees its topic's one dead letter
    (on NSQ two reads of one topic at once would split it), and nsqd never had more
    than two of the console's readers at a time."""
    nsqd = default_ports_nsqd()
    topics = ["a.dead", "b.dead", "c.dead"]
    for topic in topics:
        nsqd.create_channel(topic, DEAD_LETTER_CHANNEL)
        nsqd.publish(topic, dead_letter_envelope(make_message(topic="orders"), "r", "t"))
    url = health(status("nsq", "orders", "a.dead"), [])
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], console_workers=[url],
                        console_dead_letter_topics=topics[1:], log_level="warning")  # fmt: skip
    most = 0
    done = asyncio.Event()

    def readers() -> int:
        stats = nsqd.stats()
        return sum(
            len(c.get("clients") or [])
            for t in stats["topics"] for c in t.get("channels") or []
            if c.get("channel_name") == DEAD_LETTER_CHANNEL
        )  # fmt: skip

    async def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, await asyncio.to_thread(readers))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    async with console(settings) as web:
        assert (await web.get("/")).status_code == 200  # the fleet read once, as it runs
        pages = await asyncio.gather(
            *(web.get("/dead-letters", params={"topic": t}) for t in topics * 3)
        )
    done.set()
    await watcher
    for page in pages:
        assert page.status_code == 200 and "1 dead letter<" in page.text, page.text[-2000:]
    assert 1 <= most <= MAX_LISTINGS
