"""A dead-letter publish that fails for a reason other than its size, on a real nsqd
(docs/tasks.md, "Dead letters": "If the publish or the hook raises, the message is
retried instead of finished: it comes back and is rejected again later, so nothing is
lost").

nsqd refuses the publish with ``E_UNAUTHORIZED``: the worker's AUTH secret may read its
dead-letter topic (so the tools' channel is kept) but not publish there yet. While that
lasts, nsqd keeps the message and hands it back again and again; once the auth server
grants the publish, exactly one dead letter lands and the message is finished.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nsqworker import Message, Registry, Reject, Worker
from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Outcome
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, NsqdProcess, wait_until
from nsqworker.testing.holds import holds_async
from tests.json_server import json_server

SECRET = "may-not-publish-dead-letters-yet"
TOPIC, CHANNEL, DEAD = "orders", "billing", "orders.dead"
TOOLS_CHANNEL = "nsqworker-dead-letters"


class Grants:
    """nsqd's auth server: ``orders`` to read and write; ``orders.dead`` to read, and to
    write once :attr:`publish_dead` is set. A one-second TTL, so nsqd asks again soon."""

    def __init__(self) -> None:
        self.publish_dead = threading.Event()

    def __call__(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        dead = ["subscribe", "publish"] if self.publish_dead.is_set() else ["subscribe"]
        allowed = [
            {"topic": "^orders$", "channels": [".*"], "permissions": ["subscribe", "publish"]},
            {"topic": "^orders\\.dead$", "channels": [".*"], "permissions": dead},
        ]
        return 200, {"ttl": 1, "identity": "worker", "authorizations": allowed}


@pytest.fixture
def grants() -> Grants:
    return Grants()


@pytest.fixture
def auth_server(grants: Grants) -> Iterator[str]:
    with json_server(grants) as address:
        yield address


def channel(nsqd: NsqdProcess, topic: str = TOPIC, name: str = CHANNEL) -> dict[str, Any]:
    return nsqd.channel_stats(topic, name) or {}


def kept(stats: dict[str, Any]) -> int:
    """Messages nsqd still holds for the channel: waiting, deferred or in flight."""
    return sum(int(stats.get(k, 0)) for k in ("depth", "deferred_count", "in_flight_count"))


def finished(stats: dict[str, Any]) -> int:
    """FINs nsqd counted on the channel (its clients' counts: the channel has none)."""
    return sum(int(c.get("finish_count", 0)) for c in stats.get("clients") or [])


def dead_letters(nsqd: NsqdProcess) -> int:
    topic = nsqd.topic_stats(DEAD)
    return int(topic["message_count"]) if topic else 0


async def test_a_dead_letter_refused_for_another_reason_than_size_is_retried_not_lost(
    nsqd_factory: NsqdFactory, auth_server: str, grants: Grants
) -> None:
    nsqd = nsqd_factory(extra_args=[f"--auth-http-address={auth_server}"])
    settings = Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], auth_secret=SECRET, health_port=0,
        retry_delay=0.05, max_retry_delay=0.2, backoff_multiplier=0.0, log_level="critical",
    )  # fmt: skip
    reg = Registry()
    calls: list[int] = []

    @reg.task(TOPIC, channel=CHANNEL, max_attempts=100, dead_letter_topic=DEAD)
    async def refuse(msg: Message) -> None:
        calls.append(msg.attempts)
        raise Reject(f"order {msg.body.decode()} refused")

    async with Worker(reg, settings):
        await wait_until(lambda: channel(nsqd, DEAD, TOOLS_CHANNEL), 20, "the tools' channel")
        nsqd.publish(TOPIC, b"o-1")
        # Refused by nsqd (E_UNAUTHORIZED), the dead letter is not written, and the
        # message is not finished: nsqd hands it back, and it is rejected again.
        await wait_until(
            lambda: int(channel(nsqd).get("requeue_count", 0)) >= 3, 30,
            lambda: f"the message came back 3 times: {channel(nsqd)}",
        )  # fmt: skip
        assert dead_letters(nsqd) == 0
        assert kept(channel(nsqd)) == 1, channel(nsqd)  # nsqd still has it: nothing lost
        assert finished(channel(nsqd)) == 0
        assert calls[:3] == [1, 2, 3]  # each delivery is handled and rejected again

        grants.publish_dead.set()  # the operator grants the publish
        await wait_until(lambda: dead_letters(nsqd) == 1, 30, "the dead letter written")
        await wait_until(
            lambda: kept(channel(nsqd)) == 0 and finished(channel(nsqd)) == 1, 10,
            lambda: f"the message finished: {channel(nsqd)}",
        )  # fmt: skip
        # Once written, once finished: nothing more is published or handed back.
        await holds_async(
            lambda: dead_letters(nsqd) == 1 and kept(channel(nsqd)) == 0, 1.0,
            "a second dead letter or a redelivery",
        )  # fmt: skip

    letters: list[dict[str, Any]] = []

    def read(msg: Message) -> Outcome:
        letters.append(json.loads(msg.body))
        return FINISH

    reader = Consumer(DEAD, TOOLS_CHANNEL, read, settings)
    await reader.start()
    try:
        await wait_until(lambda: letters, 10, "the dead letter read back")
    finally:
        await reader.stop(0)
    (letter,) = letters
    assert letter["topic"] == TOPIC and letter["channel"] == CHANNEL
    assert letter["body"] == "o-1" and letter["reason"] == "order o-1 refused"
    assert letter["attempts"] >= 3  # written on a later delivery, not the first
