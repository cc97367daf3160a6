"""The copy of a message published to a task's ``dead_letter_topic``.

The copy is JSON, and JSON can make a body much larger: control bytes escape to six
characters each, bodies that are not UTF-8 grow by a third in base64. A copy larger
than the broker takes (nsqd's ``--max-msg-size``, NATS's ``max_payload`` or a stream's
``max_msg_size``, a RabbitMQ stream frame) would be refused, the dead-letter step would fail, and
the message would be requeued forever. So the copy is fitted to the limit: past it,
the body is cut (base64 of a prefix) and flagged with its full size and SHA-256; and
when the broker still refuses it for its size, it is sent once more without a body.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import TYPE_CHECKING, Any, Final

from nsqworker.errors import MessageTooLarge, PublishError
from nsqworker.safe_text import one_line

if TYPE_CHECKING:
    from nsqworker.message import Message
    from nsqworker.transport import Publisher

__all__ = ["DEAD_LETTER_LIMIT", "dead_letter_envelope", "publish_dead_letter"]

#: Bytes a copy may take when nsqd's --max-msg-size is not known (its default).
DEAD_LETTER_LIMIT: Final = 1024 * 1024
#: Refusals of a message for its size: nsqd's, and JetStream's (a stream's max_msg_size).
SIZE_REFUSALS: Final = ("E_BAD_MESSAGE", "JETSTREAM_10054")
#: Characters of the reason kept (a Reject's reason is the handler's free text).
MAX_REASON: Final = 4096


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def dead_letter_envelope(
    msg: Message, reason: str, task: str = "", limit: int = DEAD_LETTER_LIMIT
) -> bytes:
    """The JSON published to a dead_letter_topic for ``msg``, at most ``limit`` bytes
    (unless even an empty body does not fit).

    Keys: ``topic``, ``channel``, ``id``, ``attempts``, ``reason``, ``timestamp`` (ns,
    when nsqd first accepted the message), ``task``, ``body`` (UTF-8 text, or base64
    with ``"body_encoding": "base64"`` when the body is not valid UTF-8). A copy that
    does not fit so gets ``body_size`` (bytes) and ``body_sha256`` of the whole body,
    ``body`` the base64 of as much of it as fits, and ``body_truncated`` (true when
    that is not all of it).
    """
    reason = one_line(reason, MAX_REASON)  # it may quote the body: one line, escaped
    doc: dict[str, Any] = {"topic": msg.topic, "channel": msg.channel, "id": msg.id}
    doc.update(attempts=msg.attempts, reason=reason, timestamp=msg.timestamp, task=task)
    body = msg.body
    if len(body) <= limit:  # a larger body cannot fit whole: skip encoding it
        try:
            doc["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            doc["body"] = base64.b64encode(body).decode("ascii")
            doc["body_encoding"] = "base64"
        data = _dumps(doc)
        if len(data) <= limit:
            return data
    doc.update(body="", body_encoding="base64", body_truncated=True, body_size=len(body))
    doc["body_sha256"] = hashlib.sha256(body).hexdigest()
    room = limit - len(_dumps(doc))
    keep = max(0, room) // 4 * 3
    doc["body"] = base64.b64encode(body[:keep]).decode("ascii")
    doc["body_truncated"] = keep < len(body)  # False: whole, as base64 (escapes cost more)
    return _dumps(doc)


async def publish_dead_letter(
    producer: Publisher, topic: str, msg: Message, reason: str, task: str
) -> None:
    """Publish ``msg``'s copy to ``topic``, fitted to what the broker accepts (the
    producer's ``max_message_size``: nsqd's ``--max-msg-size`` once told or refused,
    NATS's ``max_payload``, the RabbitMQ stream frame); never refused for its size twice
    (the second try has no body; a JetStream stream's ``max_msg_size`` is only known
    from its refusal)."""
    limit = getattr(producer, "max_message_size", None) or DEAD_LETTER_LIMIT
    try:
        await producer.publish(topic, dead_letter_envelope(msg, reason, task, limit))
    except (MessageTooLarge, PublishError) as exc:
        if isinstance(exc, PublishError) and exc.code not in SIZE_REFUSALS:
            raise
        await producer.publish(topic, dead_letter_envelope(msg, reason, task, limit=0))
