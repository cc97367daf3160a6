"""The console's backlog and rates against a real nsqd: depth plus deferred, summed,
found from ``nsqd_tcp_addresses`` (HTTP port = TCP + 1) or from nsqlookupd."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from nsqworker.admin.console.backlog import Backlog
from nsqworker.admin.console.fleet import RATE_WINDOW, TaskRow, _History
from nsqworker.settings import Settings
from nsqworker.testing import NsqBinaries, NsqdProcess, NsqlookupdProcess
from tests.json_server import json_server


def adjacent_ports() -> tuple[int, int]:
    """Two free loopback ports, the second the first + 1 (nsqd's 4150/4151 layout)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port, port + 1
    raise AssertionError("no two adjacent free ports")


async def test_depth_and_deferred_from_nsqd_tcp_addresses(
    nsq_binaries: NsqBinaries, tmp_path: Path
) -> None:
    tcp, http = adjacent_ports()
    with NsqdProcess(
        tcp_port=tcp, http_port=http, binary=nsq_binaries.nsqd, data_path=tmp_path
    ) as nsqd:
        nsqd.create_channel("orders", "billing")
        nsqd.mpublish("orders", ["a", "b", "c"])
        nsqd.publish("orders", "later", defer_ms=60_000)
        nsqd.publish("fresh", "x")  # no channel yet: the topic's depth
        settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
        async with httpx.AsyncClient(trust_env=False) as http_client:
            backlog = Backlog(settings, http_client)
            keys = [("nsq", "orders", "billing"), ("nsq", "fresh", "c"), ("nsq", "none", "c")]
            values = await backlog.measure(keys)
    assert [values[k].count for k in keys] == [4, 1, 0]


async def test_summed_over_the_nsqd_lookupd_knows(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: object
) -> None:
    first, second = nsqd_factory(nsqlookupd), nsqd_factory(nsqlookupd)  # type: ignore[operator]
    first.mpublish("orders", ["a", "b"])
    second.mpublish("orders", ["c"])
    settings = Settings(lookupd_http_addresses=[nsqlookupd.http_address])
    async with httpx.AsyncClient(trust_env=False) as http_client:
        backlog = Backlog(settings, http_client)
        key = ("nsq", "orders", "billing")

        async def count() -> int | None:
            return (await backlog.measure([key]))[key].count

        counts: list[int | None] = []
        for _ in range(100):  # nsqd registers with lookupd within a second or so
            counts.append(await count())
            if counts[-1] == 3:
                break
            import asyncio

            await asyncio.sleep(0.1)
    assert counts[-1] == 3


async def test_an_unreachable_nsqd_is_a_note() -> None:
    from nsqworker.testing import free_port

    settings = Settings(
        nsqd_tcp_addresses=[f"127.0.0.1:{free_port()}"],
        rabbitmq_stream_uri=f"rabbitmq-stream://guest:guest@127.0.0.1:{free_port()}/",
    )
    async with httpx.AsyncClient(trust_env=False, timeout=2) as http_client:
        value = (await Backlog(settings, http_client).measure([("nsq", "t", "c")]))[
            ("nsq", "t", "c")
        ]
    assert value.count is None and "nsqd stats unavailable" in value.note
    rabbit = (await Backlog(settings, http_client).measure([("rabbitmq", "s", "c")]))[
        ("rabbitmq", "s", "c")
    ]
    assert rabbit.count is None and "RabbitMQ Streams unavailable" in rabbit.note


def row(handled: int, requeued: int = 0, dead: int = 0) -> TaskRow:
    return TaskRow("t", "nsq", "t", "c", finished=handled - requeued - dead, requeued=requeued,
                   dead_lettered=dead)  # fmt: skip


def test_rates_and_recent_counts() -> None:
    history = _History()
    history.add(0.0, [row(100, 10, 1)])
    now = [row(400, 30, 4)]
    history.add(30.0, now)
    history.apply(30.0, now)
    assert now[0].rate == 10.0  # 300 handled in 30 s
    assert (now[0].retries_recent, now[0].dead_recent) == (20, 3)
    later = [row(460, 30, 4)]
    history.add(RATE_WINDOW + 31.0, later)
    history.apply(RATE_WINDOW + 31.0, later)
    assert later[0].rate == 60 / (RATE_WINDOW + 1)  # from the reading at 30 s
    restarted = [row(5, 1, 0)]  # a supervisor restarted: its counters began again
    history.add(RATE_WINDOW + 32.0, restarted)
    history.apply(RATE_WINDOW + 32.0, restarted)
    assert restarted[0].rate >= 0 and restarted[0].retries_recent == 1


async def test_a_hostile_lookupd_is_a_note_not_a_crash() -> None:
    hostile = ["producers", {"broadcast_address": 1}]  # a list where an object belongs
    with json_server(lambda path, query: (200, hostile)) as address:
        settings = Settings(lookupd_http_addresses=[f"http://{address}"])
        async with httpx.AsyncClient(trust_env=False, timeout=2) as http_client:
            key = ("nsq", "t", "c")
            value = (await Backlog(settings, http_client).measure([key]))[key]
    assert value.count is None and "nsqd stats unavailable" in value.note
