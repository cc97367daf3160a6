"""Hostile message bodies against a Worker on a real nsqd (docs/security.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import pytest
import structlog

from nsqworker.errors import UndecodableBody
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry, Reject
from nsqworker.testing import NsqdFactory, NsqdProcess, wait_until
from nsqworker.testing.holds import holds_async
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
        nsqd_tcp_addresses=[nsqd.tcp_address], backoff_multiplier=1.0, retry_delay=0.05
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


async def read_all(nsqd: NsqdProcess, topic: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    readers = Registry()

    @readers.task(topic, channel="peek")
    async def reader(msg: Message) -> None:
        got.append(msg.body)

    async with Worker(readers, Settings(nsqd_tcp_addresses=[nsqd.tcp_address])):
        await wait_until(lambda: len(got) >= count, message=f"{count} on {topic}")
    return got


@pytest.mark.parametrize("max_msg_size", [None, 300_000], ids=["default", "small-nsqd"])
async def test_a_dead_letter_too_big_for_nsqd_is_fitted_and_never_loops(
    nsqd_factory: NsqdFactory, max_msg_size: int | None
) -> None:
    extra = [f"--max-msg-size={max_msg_size}"] if max_msg_size else []
    nsqd = nsqd_factory(extra_args=extra)
    # The worker makes the tools' channel on big_dead when it starts: the reader's own
    # channel must exist before the dead letters come, or nsqd gives it none of them.
    nsqd.create_channel("big_dead", "peek")
    limit = max_msg_size or 1024 * 1024
    registry = Registry()
    seen: list[int] = []

    @registry.task("big", channel="c", max_attempts=1, dead_letter_topic="big_dead")
    async def handle(msg: Message) -> None:
        seen.append(msg.attempts)
        raise Reject("no")

    # 200 KB of control bytes escape to 1.2 MB of JSON; non-UTF-8 grows by a third.
    bodies = [b"\x01" * 200_000, b"\xff" * (limit * 4 // 5)]
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.05)
    async with Worker(registry, settings):
        for body in bodies:
            nsqd.publish("big", body)
        await wait_until(lambda: nsqd.depth("big", "c") == 0 and len(seen) >= 2,
                         message="both given up")  # fmt: skip
        await holds_async(lambda: seen == [1, 1], 1.0, f"handled again: {seen}")  # no requeue
    letters = [json.loads(b) for b in await read_all(nsqd, "big_dead", 2)]
    for doc, body in zip(letters, bodies, strict=True):
        assert doc["body_encoding"] == "base64"
        assert doc["body_size"] == len(body)
        assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()
        kept = base64.b64decode(doc["body"])
        assert body.startswith(kept)
        assert doc["body_truncated"] is (len(kept) < len(body))
        assert len(json.dumps(doc, ensure_ascii=False, separators=(",", ":"))) <= limit
    assert not letters[0]["body_truncated"]  # whole, as base64 rather than escaped
    assert letters[1]["body_truncated"]
    if max_msg_size is None:  # within the limit assumed (nsqd's default): as much as fits
        assert len(letters[1]["body"]) > 1_000_000
    else:  # nsqd refused the copy for its size: sent once more, without the body
        assert letters[1]["body"] == ""
