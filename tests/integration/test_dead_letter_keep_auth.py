"""A worker whose AUTH secret may publish to its dead-letter topic but not subscribe
there cannot make the tools' channel: it says so once and still dead-letters every
message (nsqd's own counts), never retrying them in a loop or crashing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nsqworker import Message, Registry, Reject, Worker
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, wait_until
from tests.json_server import json_server

SECRET = "publish-only-on-the-dead-letters"


def grant(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
    """nsqd's auth server: ``orders`` to read and write, ``orders.dead`` to write only."""
    allowed = [
        {"topic": "^orders$", "channels": [".*"], "permissions": ["subscribe", "publish"]},
        {"topic": "^orders\\.dead$", "channels": [".*"], "permissions": ["publish"]},
    ]
    return 200, {"ttl": 3600, "identity": "worker", "authorizations": allowed}


@pytest.fixture
def auth_server() -> Iterator[str]:
    with json_server(grant) as address:
        yield address


async def test_without_subscribe_rights_dead_letters_still_go_out(
    nsqd_factory: NsqdFactory, auth_server: str, log_lines: Any
) -> None:
    nsqd = nsqd_factory(extra_args=[f"--auth-http-address={auth_server}"])
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], auth_secret=SECRET,
                        health_port=0, retry_delay=0.05)  # fmt: skip
    reg = Registry()

    def refuse(msg: Message) -> None:  # a sync handler: run in the pool
        raise Reject(f"order {msg.body!r} refused")

    reg.task("orders", channel="billing", max_attempts=1, dead_letter_topic="orders.dead")(refuse)

    async with Worker(reg, settings):
        nsqd.mpublish("orders", [b"1", b"2", b"3"])

        def dead() -> int:
            topic = nsqd.topic_stats("orders.dead")
            return int(topic["message_count"]) if topic else 0

        await wait_until(lambda: dead() == 3, timeout=30, message="three dead letters")
        billing = nsqd.channel_stats("orders", "billing") or {}
        assert billing.get("requeue_count") == 0 and billing.get("depth") == 0
    said = [x for x in log_lines() if x.get("event") == "dead-letter topic not kept for the tools"]
    assert len(said) == 1 and "orders.dead" in json.dumps(said[0])
    assert nsqd.channel_stats("orders.dead", "nsqworker-dead-letters") is None
