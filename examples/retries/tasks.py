"""What happens when handlers are slow, not ready, flaky, or given bad input.

Each task shows one row of the outcome table in docs/tasks.md; README.md says what to
publish to see it. The settings that matter (``retry_delay``, ``max_attempts``) are
set per task here so the example shows them quickly.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from nsqworker import Message, Reject, Retry, task
from nsqworker.logging import get_logger

log = get_logger(__name__)

DEAD_LETTERS = "retries_dead"


def load(msg: Message) -> dict[str, Any]:
    """The body as a JSON object, or Reject: bad input will not get better by retrying."""
    try:
        data = msg.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Reject("body is not JSON") from None
    if not isinstance(data, dict):
        raise Reject("body is not a JSON object")
    return data


@task("retries_slow", channel="work")
def slow(msg: Message) -> None:
    """A long job. The worker TOUCHes the message while it runs, so nsqd does not hand
    it to someone else after its msg_timeout (start nsqd with --msg-timeout=2s to see)."""
    log.info("slow job started; takes 5 s", attempts=msg.attempts)
    time.sleep(5)
    log.info("slow job done", touches=msg.touch_count)


@task("retries_not_ready", channel="work", max_attempts=5)
async def not_ready(msg: Message) -> None:
    """Retry(delay): come back in exactly that many seconds (counts as an attempt)."""
    if msg.attempts < 3:
        log.info("not ready yet; asking for a retry in 2 s", attempts=msg.attempts)
        raise Retry(delay=2, reason="upstream report not ready")
    log.info("ready on attempt 3", attempts=msg.attempts)


@task("retries_flaky", channel="work", retry_delay=1, max_attempts=5)
async def flaky(msg: Message) -> None:
    """Any other exception: REQ after retry_delay x retry_multiplier^(attempts-1),
    here about 1 s, then 2 s; the third attempt succeeds."""
    if msg.attempts < 3:
        raise ConnectionError(f"database unavailable (attempt {msg.attempts})")
    await asyncio.sleep(0.1)
    log.info("stored on attempt 3", attempts=msg.attempts)


async def alert(msg: Message, reason: str) -> None:
    """on_dead_letter: called once when a message is rejected, before the broker settles it.

    If this raises, the message is retried rather than lost."""
    log.error(f"dead letter from {msg.topic}: {reason}", id=msg.id, attempts=msg.attempts)


@task(
    "retries_orders",
    channel="work",
    max_attempts=3,
    retry_delay=1,
    dead_letter_topic=DEAD_LETTERS,
    on_dead_letter=alert,
)
async def order(msg: Message) -> None:
    """Reject(reason) skips the retries; an order with "fail": true fails every attempt and
    is dead-lettered after max_attempts (3). Both go to alert() and to DEAD_LETTERS."""
    data = load(msg)
    if "id" not in data:
        raise Reject('no "id" in the order')
    if data.get("fail"):
        raise RuntimeError("payment service keeps failing")
    log.info("order accepted", order=data["id"])


@task(DEAD_LETTERS, channel="inspect")
def inspect_dead_letter(msg: Message) -> None:
    """Reads the dead-letter topic: each message is a JSON envelope around the original."""
    try:
        letter = msg.json()
        where, reason = f"{letter['topic']}/{letter['channel']}", letter["reason"]
    except (ValueError, KeyError, TypeError):
        log.info("not a dead letter", body=msg.body[:80])
        return
    log.info(f"dead letter of {where} after {letter['attempts']} attempt(s): {reason}",
             body=letter["body"])  # fmt: skip
