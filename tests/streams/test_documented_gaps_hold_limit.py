"""The retry hold limit on a real RabbitMQ 4.0 with streams (docs/security.md: "held in
memory (past 1,000 held, the channel's later retries wait)"; docs/rabbitmq-streams.md,
"Retries": "Up to 1,000 retries are held per subscription; past that the retry streams
are read in order again until some are due").

The channel's retry stream is written as a writer to it could: 1,000 retries due in
``HOLD`` seconds, one due now (``first``), one more due in ``HOLD`` seconds, and another
due now (``second``). ``first`` comes while exactly 1,000 are held, so it is read ahead
and handled at once; ``second`` comes behind the 1,001st, which must wait for room, so
it is handled only once the first held retries are due. The broker's stored offset says
the same: nothing of the retry stream is passed while the held retries wait, and
everything once they are handled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from nsqworker.message import Message
from nsqworker.streams.retries import HOLD_LIMIT
from nsqworker.streams.subscription import retry_stream
from nsqworker.task import Registry
from nsqworker.testing import wait_until
from nsqworker.testing.holds import window
from nsqworker.worker import Worker
from tests.streams.test_streams_hostile import raw_send, settings

CHANNEL = "c"
HOLD = window(10.0)
"""Seconds until the held retries are due: the worker must start and read 1,002 retries
within it (a lower bound is what the test proves, so the margin costs only time)."""


async def stored_offset(uri: str, stream: str, reference: str) -> int | None:
    """The offset ``reference`` stored on ``stream``, as RabbitMQ says (None: none)."""
    from rstream import Consumer as Reader
    from rstream.exceptions import OffsetNotFound

    from nsqworker.streams.client import Endpoint

    e = Endpoint.from_settings(settings(uri))
    reader = Reader(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                    password=e.password)  # fmt: skip
    await reader.start()
    try:
        return int(await reader.query_offset(stream, reference))
    except OffsetNotFound:
        return None
    finally:
        await reader.close()


async def test_past_the_hold_limit_a_due_retry_waits_for_room(rabbitmq: str) -> None:
    from rstream import AMQPMessage

    assert HOLD_LIMIT == 1000  # the documented figure
    topic = f"holds_{uuid.uuid4().hex[:8]}"
    retries = retry_stream(topic, CHANNEL)
    due_at = time.time() + HOLD
    later = int(due_at * 1000)

    def retry(body: bytes, not_before: int) -> Any:
        return AMQPMessage(body=body, application_properties={
            "x-attempts": 2, "x-not-before": not_before})  # fmt: skip

    batch = [retry(b"held-%d" % i, later) for i in range(HOLD_LIMIT)]
    batch += [retry(b"first", 0), retry(b"held-last", later), retry(b"second", 0)]
    await raw_send(rabbitmq, retries, batch)  # offsets 0..1002 of the retry stream
    last_offset = len(batch) - 1

    handled: dict[bytes, float] = {}
    registry = Registry()

    @registry.task(topic, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        assert msg.body not in handled, f"{msg.body!r} handled twice"
        handled[msg.body] = time.time()

    async with Worker(registry, settings(rabbitmq, log_level="critical")):
        await wait_until(lambda: b"first" in handled, HOLD, "the retry due now, read ahead")
        # Read ahead at once, not when the held ones are due (timers may fire early).
        assert handled[b"first"] < due_at - 1.0, handled[b"first"] - due_at
        # The 1,000 held are not settled: the broker has no offset past the first of them.
        assert await stored_offset(rabbitmq, retries, CHANNEL) is None
        assert b"second" not in handled  # behind the 1,001st, which waits for room
        await wait_until(
            lambda: len(handled) == len(batch), HOLD + window(30),
            lambda: f"every retry handled: {len(handled)} of {len(batch)}",
        )  # fmt: skip

        async def all_passed() -> bool:
            stored = await stored_offset(rabbitmq, retries, CHANNEL)
            return stored is not None and stored >= last_offset

        deadline = time.monotonic() + window(10)
        while not await all_passed():
            assert time.monotonic() < deadline, "the retry stream's offset never passed them"
            await asyncio.sleep(0.2)
    # uvloop's timers may fire a millisecond early against the wall clock.
    assert handled[b"second"] >= due_at - 0.05, handled[b"second"] - due_at
    held = [t - due_at for body, t in handled.items() if body.startswith(b"held")]
    assert min(held) >= -0.05, min(held)
    # Each held retry is due when it says, the 1,001st too: the time it waited for room
    # counts (it was once held for its whole wait again from then, 9 s late here).
    assert max(held) < window(2.0), max(held)
