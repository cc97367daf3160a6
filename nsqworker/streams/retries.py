"""Retries on RabbitMQ Streams: which retry stream a delay goes to, what a retry carries,
and the hold that keeps retries read ahead until they are due.

A stream is read in order, so one retry stream read message by message holds every
retry behind a long one until the long one is due (head-of-line blocking: a 60 s retry
ahead made the 1 s retries behind it 59 s late). Two things keep each retry on time:

* **buckets**: a retry goes to the retry stream of its delay's bucket
  (:data:`BUCKETS`: up to 10 s, up to 10 min, longer), so the offset stored for the
  short retries is not held back for hours by a long one: after a restart, what is
  read again of a bucket is at most the retries settled within its longest delay;
* **read-ahead**: a retry that is not due yet is held in memory (its offset stays
  unsettled, so the stored offset never passes it), and the ones behind it are read on;
  each is handed to the window when due. At most :data:`HOLD_LIMIT` are held per
  subscription; past that the readers wait (in order again) until some are due.

A retry carries its attempt count and not-before time (``x-attempts``, ``x-not-before``
in ms) and where the message first was: its offset in the topic's stream and the time it
was published there (``x-origin-offset``, ``x-origin-timestamp`` in ms), so a retried
message keeps its id (``<topic>:<offset>``) and timestamp, and its dead letter names the
original, not the retry stream's copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from nsqworker.message import Message

__all__ = [
    "ATTEMPTS",
    "BUCKETS",
    "HOLD_LIMIT",
    "NOT_BEFORE",
    "ORIGIN_OFFSET",
    "ORIGIN_TIMESTAMP",
    "UNDECODABLE",
    "retry_properties",
    "retry_stream",
    "retry_streams",
]

ATTEMPTS, NOT_BEFORE, UNDECODABLE = b"x-attempts", b"x-not-before", b"x-undecodable"
ORIGIN_OFFSET, ORIGIN_TIMESTAMP = b"x-origin-offset", b"x-origin-timestamp"

BUCKETS: Final = ((10.0, ""), (600.0, ".10m"), (float("inf"), ".long"))
"""(longest delay in seconds, suffix of the retry stream's name) per bucket: a retry
goes to the first bucket whose longest delay is at least its own."""
HOLD_LIMIT: Final = 1000
"""Retries read ahead and held until due, per subscription; past it, the retry
streams are read in order (a long retry ahead then delays the ones behind it)."""


def retry_stream(topic: str, channel: str, delay: float = 0.0) -> str:
    """The stream holding ``channel``'s retries of ``topic`` due in ``delay`` seconds:
    ``<topic>.<channel>.retry`` up to 10 s, ``.retry.10m`` up to 10 min, ``.retry.long``
    beyond."""
    for longest, suffix in BUCKETS:
        if delay <= longest:
            return f"{topic}.{channel}.retry{suffix}"
    raise AssertionError("the last bucket takes every delay")  # pragma: no cover


def retry_streams(topic: str, channel: str) -> list[str]:
    """Every retry stream of ``channel`` on ``topic``, shortest delays first."""
    return [f"{topic}.{channel}.retry{suffix}" for _, suffix in BUCKETS]


def retry_properties(msg: Message, delay: float, now: float) -> dict[str, Any]:
    """The application properties of ``msg``'s retry, due ``delay`` seconds after
    ``now`` (seconds since the epoch): attempts, not-before, and its origin (the offset
    in its id, ``<stream>:<offset>``, and its publish time)."""
    props: dict[str, Any] = {
        "x-attempts": msg.attempts + 1,
        "x-not-before": int((now + delay) * 1000),
    }
    offset = msg.id.rpartition(":")[2]
    if offset.isdigit():
        props["x-origin-offset"] = int(offset)
        props["x-origin-timestamp"] = msg.timestamp // 1_000_000
    return props


def origin(properties: dict[Any, Any], offset: int, timestamp_ms: int) -> tuple[int, int]:
    """The offset and publish time (ms) of the message a retry copies, from its
    properties (the copy's own when they are missing or not integers)."""
    first = properties.get(ORIGIN_OFFSET)
    when = properties.get(ORIGIN_TIMESTAMP)
    if type(first) is int and first >= 0 and type(when) is int and when >= 0:
        return first, when
    return offset, timestamp_ms
