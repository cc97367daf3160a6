"""FINs of small read bursts share a write (nsq.connection.FIN_DELAY), but never hold
back a consumer whose RDY is small: there a FIN is what lets the next message come."""

from __future__ import annotations

import asyncio
import time

import pytest

from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nsq import connection
from nsqworker.settings import Settings
from nsqworker.testing import NsqdProcess

pytestmark = pytest.mark.integration

TOPIC, CHANNEL = "fin_batching", "c"


async def drain(nsqd: NsqdProcess, count: int, max_in_flight: int) -> float:
    """Seconds for a Consumer to take ``count`` queued messages, first to last."""
    nsqd.create_channel(TOPIC, CHANNEL)
    nsqd.mpublish(TOPIC, [b"x"] * count)
    times: list[float] = []
    done = asyncio.Event()

    def callback(msg: Message) -> Outcome:
        times.append(time.perf_counter())
        if len(times) == count:
            done.set()
        return FINISH

    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    consumer = Consumer(TOPIC, CHANNEL, callback, settings, max_in_flight=max_in_flight)
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await consumer.stop()
    return times[-1] - times[0]


async def test_with_rdy_1_each_fin_goes_out_at_once(
    nsqd: NsqdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held FINs would cost FIN_DELAY per message here. At the real 2 ms that is what a
    # loaded machine's round trip costs anyway, so the delay is made 20 ms: held, 200
    # messages take 4 s at least; sent at once, a round trip may take up to 10 ms.
    monkeypatch.setattr(connection, "FIN_DELAY", 0.02)
    count = 200
    elapsed = await drain(nsqd, count, max_in_flight=1)
    assert elapsed < 0.5 * count * connection.FIN_DELAY, elapsed


async def test_with_a_large_rdy_every_message_is_finished(nsqd: NsqdProcess) -> None:
    await drain(nsqd, 2000, max_in_flight=500)
    deadline = time.monotonic() + 5
    while nsqd.in_flight(TOPIC, CHANNEL) or nsqd.depth(TOPIC, CHANNEL):
        assert time.monotonic() < deadline, "FINs held back"
        await asyncio.sleep(0.01)
