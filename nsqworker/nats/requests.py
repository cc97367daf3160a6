"""NATS request/reply for ``@rpc``: a core NATS queue subscription, not JetStream.

A NATS request is a message with a reply subject that NATS routes back to the caller
(``nats req``, ``nc.request()``, :class:`~nsqworker.rpc.RpcClient` on NATS). A stream
capturing the subject would answer it with its own publish ack, so endpoints read
requests with a plain subscription in the queue group ``channel``: the server hands each
request to one of the group's members. Core NATS delivers at most once: nothing here is
acknowledged, retried or dead-lettered by the server; the caller's timeout is the retry.
The reply subject is the caller's word: the endpoint checks it against
``rpc_reply_subjects`` before answering (nsqworker.rpc.replies), and :meth:`_respond`
never publishes to a ``$`` subject (the server's API) whatever it is given.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nsqworker.errors import InvalidName
from nsqworker.message import Message
from nsqworker.nats.jetstream import check_channel, check_subject
from nsqworker.subscription_kit import NoDeliveryDeadline, SubscriptionKit
from nsqworker.transport import Flow, Receiver, SubscriptionStats

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription as NatsSub

    from nsqworker.nats.client import NatsConnection

__all__ = ["NatsRequest", "NatsRequestSubscription"]

log = logging.getLogger("nsqworker.nats")

RESUBSCRIBE = (0.1, 5.0)
"""Seconds before joining the queue group again after a failure: the first, doubled per
failure (with jitter) up to the second, so an endpoint is back soon after its server."""
_monotonic = time.monotonic


class NatsRequest(Message):
    """A request read from NATS: ``receipt`` is its reply subject and
    ``await respond(body, headers)`` answers it there."""

    __slots__ = ("respond",)

    def __init__(self, *args: Any, respond: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.respond = respond


class NatsRequestSubscription(SubscriptionKit, NoDeliveryDeadline):
    """Requests to ``topic`` (a subject), one of the queue group ``channel`` each."""

    _log = log

    def __init__(
        self, topic: str, channel: str, connection: NatsConnection, *, name: str,
        max_in_flight: int,
    ) -> None:  # fmt: skip
        super().__init__(
            check_subject(topic), check_channel(channel), name=name, window=max_in_flight,
            errors=connection.errors,
        )  # fmt: skip
        self.connection = connection
        self.in_flight = 0
        self.received = 0
        self.dropped = 0
        self._sub: NatsSub | None = None
        self._prefix = os.urandom(4).hex().encode()

    def __repr__(self) -> str:
        return f"<NatsRequestSubscription {self.topic} queue={self.channel}>"

    # --- lifecycle -------------------------------------------------------------

    async def start(self, receiver: Receiver) -> None:
        """Connect and join the queue group; a server that does not answer is retried
        in the background (``ready`` stays False), refused credentials raise."""
        if not self._starting(receiver):
            return
        await self._first_attempt(self._subscribe, self._joined, RESUBSCRIBE, "NATS")

    async def _subscribe(self) -> None:
        client = await self.connection.get()
        if self._sub is None and not self._stopping:
            self._sub = await client.subscribe(self.topic, queue=self.channel, cb=self._on_msg)
            log.info(
                "%s: serving NATS requests on %s (queue %s)", self.name, self.topic, self.channel
            )

    def _joined(self) -> bool:
        return self._sub is not None

    async def stop(self) -> None:
        """Take no more requests: leave the queue group (the server sends new requests to
        its other members); requests in hand are still answered."""
        self._stopping = True
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await asyncio.wait_for(sub.unsubscribe(), timeout=5.0)
            except Exception:
                log.debug("leaving the queue group failed", exc_info=True)

    async def close(self) -> None:
        """Stop, and end the background work."""
        await self.stop()
        self._cancel_tasks()

    @property
    def subscribed(self) -> bool:
        """True while in the queue group and connected."""
        return self._sub is not None and self.connection.connected

    def set_flow(self, flow: Flow, window: int) -> None:
        """Noted only: core NATS has no flow control; requests over the window wait in
        the dispatcher, and a caller that waits too long times out."""
        self.window = window

    # --- requests --------------------------------------------------------------

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:  # a plain publish, not a request: nobody to answer
            self.dropped += 1
            return
        self.received += 1
        message = NatsRequest(
            self._prefix + b"%08x" % (self.received & 0xFFFFFFFF), msg.data, time.time_ns(), 1,
            self.topic, self.channel, self.connection.address, self._receiver, msg.reply,
            _monotonic(), msg.headers, respond=self._respond,
        )  # fmt: skip
        self.in_flight += 1
        if self._deliver(message):  # type: ignore[misc]
            self.in_flight -= 1

    async def _respond(
        self, reply: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        if reply.startswith("$"):  # the server's API ($JS.API...): never, whoever asks
            raise InvalidName(f"reply subject {reply!r} is a $ subject: not answered")
        client = await self.connection.get()
        await client.publish(reply, body, headers=dict(headers) if headers else None)

    def finish(self, msg: Message) -> None:
        """Nothing to send: a core NATS request is not acknowledged."""
        self.in_flight -= 1

    def retry(self, msg: Message, delay: float) -> None:
        """Nothing to send: core NATS does not deliver a request again (the caller's
        timeout is the retry)."""
        self.in_flight -= 1
        self.dropped += 1

    def reject(self, msg: Message) -> None:
        """Nothing to send (its dead letter, if any, is written by the task layer)."""
        self.in_flight -= 1

    # --- stats -----------------------------------------------------------------

    def stats(self) -> SubscriptionStats:
        """In hand, and the connection's errors."""
        return SubscriptionStats(
            connected=int(self.connection.connected),
            window=self.window,
            in_flight=self.in_flight,
            errors=self._error_counts(),
            connections=[{
                "address": self.connection.address, "subject": self.topic,
                "queue": self.channel, "received": self.received, "dropped": self.dropped,
            }],
        )  # fmt: skip
