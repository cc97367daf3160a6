"""A task's dead-letter chain, and the copy of a message it publishes to the task's
``dead_letter_topic``.

The copy is JSON, and JSON can make a body much larger: control bytes escape to six
characters each, bodies that are not UTF-8 grow by a third in base64. A copy larger
than the broker takes (nsqd's ``--max-msg-size``, NATS's ``max_payload`` or a stream's
``max_msg_size``, a RabbitMQ stream frame) would be refused, the dead-letter step would fail, and
the message would be requeued forever. So the copy is fitted to the limit: past it,
the body is cut (base64 of a prefix) and flagged with its full size and SHA-256; and
when the broker still refuses it for its size, it is sent once more without a body.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from nsqworker.errors import MessageTooLarge, PublishError
from nsqworker.hooks import call
from nsqworker.outcomes import Reject
from nsqworker.safe_text import one_line

if TYPE_CHECKING:
    from nsqworker.message import Message
    from nsqworker.task import TaskSpec
    from nsqworker.transport import Publisher, Transport

__all__ = ["DEAD_LETTER_LIMIT", "DeadLetterChain", "dead_letter_envelope", "publish_dead_letter"]


class DeadLetterChain:
    """One task's dead-letter path: its log line, the copy published to the task's
    ``dead_letter_topic``, then its ``on_dead_letter``, then the dead-letter ``hooks``
    (the registry's and the task's). ``count``: messages through it so far."""

    def __init__(
        self, spec: TaskSpec, transport: Transport, hooks: Sequence[Callable[..., Any]], log: Any
    ) -> None:
        self.spec = spec
        self.transport = transport
        self.hooks = hooks
        self.log = log
        self.count = 0
        self._logged: set[str] = set()  # rejected by their handler: line written then
        self._early: asyncio.Future[None] | None = None
        self._told: set[str] = set()
        self._quiet_until = 0.0  # after a failure to keep: not tried again before

    def start(self) -> None:
        """Begin keeping the dead-letter topic for the tools now, in the background (on
        NSQ: the tools' channel, :meth:`NsqTransport.retain`), so it is there
        before the first dead letter; :meth:`run` makes sure again before each."""
        if self.spec.dead_letter_topic is not None and self._keeper() is not None:
            self._early = asyncio.ensure_future(self._keep(None))

    def close(self) -> None:
        """Stop keeping in the background."""
        if self._early is not None:
            self._early.cancel()

    def _keeper(self) -> Callable[[str, Message | None], Awaitable[None]] | None:
        return getattr(self.transport, "retain", None)

    async def _keep(self, msg: Message | None) -> None:
        """Keep the topic for the tools; a failure is logged (once per kind), never
        raised: the dead letter is published all the same."""
        keep, topic = self._keeper(), self.spec.dead_letter_topic
        if keep is None or topic is None or time.monotonic() < self._quiet_until:
            return
        try:
            await keep(topic, msg)
        except Exception as exc:
            self._quiet_until = time.monotonic() + KEEP_RETRY
            text = one_line(f"{type(exc).__name__}: {exc}", 300)
            if text not in self._told:
                self._told.add(text)
                self.log.warning(
                    "dead-letter topic not kept for the tools", dead_letter_topic=topic,
                    error=text,
                )  # fmt: skip

    def handler_rejected(self, msg: Message, reason: str, exc: BaseException | None) -> None:
        """The handler's failure gives the message up: its line now, in the handler's
        span (:meth:`run` follows from the dispatcher)."""
        self.log_line(msg, reason, exc)
        self._logged.add(msg.id)

    def log_line(self, msg: Message, reason: str, exc: BaseException | None) -> None:
        """One line per dead letter: a Reject's at warning with its reason (an expected
        outcome), any other at error with the traceback of the failure, if any."""
        if isinstance(exc, Reject):
            self.log.warning("dead-letter", id=msg.id, attempts=msg.attempts, reason=reason)
        else:
            error = type(exc).__name__ if exc is not None else None
            self.log.error(
                "dead-letter", id=msg.id, attempts=msg.attempts, reason=reason, error=error,
                exc_info=exc,
            )  # fmt: skip

    async def run(self, msg: Message, reason: str) -> None:
        """The chain, for the dispatcher's reject. Any exception propagates, so the
        dispatcher retries the message instead. The reason may quote the body (a key, a
        broker's property): it is made one line, its control characters escaped, before
        anyone logs, publishes or hooks it."""
        spec = self.spec
        reason = one_line(reason)
        if msg.id in self._logged:  # its handler rejected it: logged then, in its span
            self._logged.discard(msg.id)
        else:  # past max_attempts on arrival, undecodable...
            self.log_line(msg, reason, None)
        if spec.dead_letter_topic is not None:
            await self._keep(msg)
            producer = self.transport.publisher(msg)
            await publish_dead_letter(producer, spec.dead_letter_topic, msg, reason, spec.name)
        if spec.on_dead_letter is not None:
            await call(spec.on_dead_letter, msg, reason)
        for hook in self.hooks:
            await call(hook, msg, reason)
        self.count += 1


#: Seconds before keeping a dead-letter topic for the tools is tried again after it
#: failed (the secret may not subscribe there, say): not one failed try per dead letter.
KEEP_RETRY: Final = 10.0
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
    when the broker first accepted the message: a retried message keeps its original id
    and timestamp on every transport), ``task``, ``body`` (UTF-8 text, or base64
    with ``"body_encoding": "base64"`` when the body is not valid UTF-8); on NATS and
    RabbitMQ Streams also ``stream`` and ``offset``, where the message was first stored
    (the JetStream stream and sequence; the RabbitMQ stream and offset, never a retry
    stream's copy). A copy that
    does not fit so gets ``body_size`` (bytes) and ``body_sha256`` of the whole body,
    ``body`` the base64 of as much of it as fits, and ``body_truncated`` (true when
    that is not all of it).
    """
    reason = one_line(reason, MAX_REASON)  # it may quote the body: one line, escaped
    doc: dict[str, Any] = {"topic": msg.topic, "channel": msg.channel, "id": msg.id}
    doc.update(attempts=msg.attempts, reason=reason, timestamp=msg.timestamp, task=task)
    origin = getattr(msg, "origin", None)
    if origin is not None:
        doc.update(stream=origin[0], offset=origin[1])
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
