"""One topic/channel on NATS JetStream: a durable pull consumer read by a continuous pull.

The subscription asks the consumer for messages with pull requests sent to an inbox of
its own, and never asks for more than the receiver's free window: in flight plus
requested stays at most the window (``max_in_flight``), so no message waits in this
process while its ``ack_wait`` runs out. A new request goes out when half the window is
free (or when nothing is requested at all); each asks the server for idle heartbeats, and
a request that went silent (its server died) is forgotten and asked again.

Settling is the JetStream ack protocol on each message's reply subject: ``+ACK``,
``-NAK {"delay": ns}``, ``+TERM`` and ``+WPI`` (in progress: the keep-alive). Acks and
pull requests are written in batches, one task per loop turn, not one per message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError
from nsqworker.message import Message
from nsqworker.nats.jetstream import (
    ack_wait,
    check_channel,
    check_subject,
    consumer_name,
    ensure_consumer,
    ensure_stream,
)
from nsqworker.transport import Flow, Receiver, SubscriptionStats, Timer

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription as NatsSub

    from nsqworker.nats.client import NatsConnection
    from nsqworker.settings import Settings

__all__ = ["NatsSubscription"]

log = logging.getLogger("nsqworker.nats")

EXPIRES = 30.0
"""Seconds a pull request waits on the server for messages."""
HEARTBEAT = 5.0
"""Seconds between the server's idle heartbeats on a waiting pull request."""
ACK, NAK, TERM, WPI = b"+ACK", b"-NAK", b"+TERM", b"+WPI"
_STATUSES = frozenset({"404", "408", "409", "503"})
"""Statuses the server ends a pull request with (no messages, expired, limits reached or
consumer deleted, no responders); any other is dropped. "Deleted" and "no responders"
are checked with the server before the consumer is created again."""
_monotonic = time.monotonic


class NatsSubscription:
    """``topic`` (a subject) read by the durable consumer ``channel``; see the module."""

    def __init__(
        self,
        topic: str,
        channel: str,
        connection: NatsConnection,
        settings: Settings,
        *,
        name: str,
        max_in_flight: int,
    ) -> None:
        self.topic = check_subject(topic)
        self.channel = check_channel(channel)
        self.name = name
        self.settings = settings
        self.connection = connection
        self.window = max_in_flight
        self.stream: str | None = None
        self.consumer: str | None = None
        self.in_flight = 0
        self.requested = 0
        self.received = 0
        self._flow = Flow.OPEN
        self._receiver: Receiver | None = None
        self._deliver: Callable[[Message], bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sub: NatsSub | None = None
        self._inbox = ""
        self._next = ""
        self._bound = False
        self._stopping = False
        self._out: list[tuple[str, bytes, str]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._heard = _monotonic()
        self._forget_listener: Callable[[], None] | None = None
        self._ack_wait = ack_wait(settings)
        self._checking = False
        self._dropped_logged = -60.0

    def __repr__(self) -> str:
        return f"<NatsSubscription {self.topic}/{self.channel} window={self.window}>"

    # --- lifecycle -------------------------------------------------------------

    async def start(self, receiver: Receiver) -> None:
        """Connect, find or create the stream and the channel's consumer, and pull.

        A refused login or stream set-up raises ``ConfigurationError``; a server that
        does not answer is retried in the background (``ready`` stays False).
        """
        if self._receiver is not None:
            return
        self._receiver = receiver
        self._deliver = receiver.deliver
        self._loop = asyncio.get_running_loop()
        self._forget_listener = self.connection.on_reconnect(self._reconnected)
        try:
            await self._bind()
        except ConfigurationError:
            raise
        except Exception as exc:
            log.warning("%s: NATS not ready (%s); retrying", self.name, exc)
            self._spawn(self._bind_until_done())
        self._spawn(self._watch())

    async def _bind(self) -> None:
        client = await self.connection.get()
        js = await self.connection.jetstream()
        self.stream = await ensure_stream(js, self.topic, self.settings)
        self.consumer = await consumer_name(js, self.stream, self.topic, self.channel)
        self._ack_wait = await ensure_consumer(
            js, self.stream, self.topic, self.consumer, self.settings
        )
        self._next = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        await self._subscribe(client)
        self._bound = True
        log.info("%s: bound to consumer %s of stream %s", self.name, self.consumer, self.stream)
        self._pull()

    async def _subscribe(self, client: Any) -> None:
        old, self._sub = self._sub, None
        self.requested = 0  # requests to the old inbox die with it (no interest)
        if old is not None:
            try:
                await old.unsubscribe()
            except Exception:
                log.debug("unsubscribe failed", exc_info=True)
        self._inbox = client.new_inbox()
        self._sub = await client.subscribe(self._inbox, cb=self._on_msg)
        self._heard = _monotonic()

    async def _bind_until_done(self) -> None:
        delay = self.settings.reconnect_delay
        while not self._bound and not self._stopping:
            await asyncio.sleep(delay)
            try:
                await self._bind()
            except Exception as exc:
                delay = min(delay * 2, self.settings.max_reconnect_delay)
                log.warning("%s: NATS not ready (%s); retrying in %.1fs", self.name, exc, delay)

    async def stop(self) -> None:
        """Ask for nothing more, and end the pull: the inbox is drained (UNSUB, then a
        round trip, so the server holds no request for it and every message it sent
        before is read). What arrives goes to the receiver, which, draining, hands it
        back with a NAK for another worker; messages in hand stay settleable."""
        self._stopping = True
        self._flow = Flow.PAUSED
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await asyncio.wait_for(sub.drain(), timeout=5.0)  # type: ignore[no-untyped-call]
            except Exception:  # a lost connection: its requests died with it
                log.debug("draining the pull inbox failed", exc_info=True)

    async def close(self) -> None:
        """Write the last acks, and drop the inbox (the server forgets its requests)."""
        self._stopping = True
        if self._forget_listener is not None:
            self._forget_listener()
        for task in list(self._tasks):
            task.cancel()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                log.debug("unsubscribe at close failed", exc_info=True)
            self._sub = None
        self._bound = False

    @property
    def subscribed(self) -> bool:
        """True while bound to the consumer and connected."""
        return (
            self._bound and self.connection.connected and (self._sub is not None or self._stopping)
        )

    @property
    def ready(self) -> bool:
        """Connected and bound to the channel's consumer."""
        return self.subscribed and not self._stopping

    def clock(self) -> float:
        """Monotonic seconds: the clock of ``received_at``."""
        return _monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """``callback`` after ``delay`` seconds, on the loop."""
        loop = self._loop or asyncio.get_running_loop()
        return loop.call_later(delay, callback)

    # --- flow ------------------------------------------------------------------

    def set_flow(self, flow: Flow, window: int) -> None:
        """The receiver's flow: at most ``window`` (1 when probing, 0 paused) asked for
        or in hand."""
        self._flow, self.window = flow, window
        self._pull()

    def _allowed(self) -> int:
        if self._stopping or self._flow is Flow.PAUSED:
            return 0
        return 1 if self._flow is Flow.PROBE else self.window

    def _pull(self) -> None:
        if not self._bound:
            return
        allowed = self._allowed()
        room = allowed - self.in_flight - self.requested
        if room <= 0 or (self.requested and room < max(1, allowed // 2)):
            return
        self.requested += room
        request = {
            "batch": room,
            "expires": int(EXPIRES * 1e9),
            "idle_heartbeat": int(HEARTBEAT * 1e9),
        }
        self._send(self._next, json.dumps(request).encode(), self._inbox)

    # --- messages (hot path) ---------------------------------------------------

    async def _on_msg(self, msg: Msg) -> None:
        self._heard = now = _monotonic()
        reply = msg.reply
        if reply.startswith("$JS.ACK."):
            tokens = reply.split(".")
            if len(tokens) >= 12:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>...
                del tokens[2:4]
            # only our consumer's, and <delivered>.<stream seq>.<consumer seq>.<timestamp>
            # .<pending> all numbers: anything else was not sent by the server for us
            if (
                len(tokens) < 9
                or tokens[2] != self.stream
                or tokens[3] != self.consumer
                or not all(t.isdigit() for t in tokens[4:9])
            ):
                self._drop(msg, "an ack subject not of this consumer")
                return
            self.requested = max(self.requested - 1, 0)
            self.received += 1
            message = Message(
                tokens[5].encode(), msg.data, int(tokens[7]), int(tokens[4]), self.topic,
                self.channel, self.connection.address, self._receiver, reply, now,
                msg.headers,
            )  # fmt: skip
            message.origin = (tokens[2], int(tokens[5]))
            self.in_flight += 1
            if self._deliver(message):  # type: ignore[misc]
                self._send(reply, ACK)
                self.in_flight -= 1
                self._pull()
            return
        if reply:
            self._drop(msg, "a reply subject that is no JetStream ack")
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is None or status == "100":
            return  # an idle heartbeat (or a stray message): the request is alive
        if msg.data or status not in _STATUSES:
            self._drop(msg, f"an unexpected status {status!r}")
            return
        if status == "503" or (
            status == "409" and "deleted" in headers.get("Description", "").lower()
        ):
            if not self._checking:  # the consumer may be gone: ask the server, not the message
                self._checking = True
                self._spawn(self._check_consumer())
            return
        left = headers.get("Nats-Pending-Messages")
        if left is not None and left.isdigit():
            self.requested = max(self.requested - int(left), 0)
        elif status != "404":
            self.requested = 0
        self._pull()

    async def _check_consumer(self) -> None:
        """After a "consumer deleted" or "no responders" status: create the consumer
        again if the server no longer has it; else (a forged status, or a moment
        without a leader) just pull again."""
        from nats.js.errors import NotFoundError

        try:
            js = await self.connection.jetstream()
            await js.consumer_info(self.stream or "", self.consumer or "")
        except NotFoundError:
            log.warning("%s: consumer %s was deleted; creating it again", self.name, self.consumer)
            self._bound = False
            self._spawn(self._bind_until_done())
            return
        except Exception as exc:
            log.warning("%s: checking consumer %s failed: %s", self.name, self.consumer, exc)
        finally:
            self._checking = False
        self.requested = 0
        self._pull()

    def _drop(self, msg: Msg, what: str) -> None:
        """A message on the pull inbox that the server did not send for this consumer
        (someone who knows the inbox's name published it): never handled, never acked."""
        self.connection.errors["forged"] = self.connection.errors.get("forged", 0) + 1
        now = _monotonic()
        if now - self._dropped_logged >= 60.0:
            self._dropped_logged = now
            log.warning(
                "%s: dropped a message on the pull inbox with %s (reply %r); not from"
                " consumer %s of stream %s (counted in errors['forged'], logged once a"
                " minute)", self.name, what, msg.reply[:120], self.consumer, self.stream,
            )  # fmt: skip

    def ack(self, msg: Message) -> None:
        """``+ACK``."""
        self._send(msg.receipt, ACK)
        self.in_flight -= 1
        self._pull()

    def retry(self, msg: Message, delay: float) -> None:
        """``-NAK`` with the delay: the server redelivers it after ``delay`` seconds."""
        payload = NAK if delay <= 0 else b'-NAK {"delay":%d}' % int(delay * 1e9)
        self._send(msg.receipt, payload)
        self.in_flight -= 1
        self._pull()

    def reject(self, msg: Message) -> None:
        """``+TERM``: the server never delivers it again (its dead letter is written)."""
        self._send(msg.receipt, TERM)
        self.in_flight -= 1
        self._pull()

    def keep_alive(self, msg: Message) -> None:
        """``+WPI`` (work in progress): restarts the message's ``ack_wait``."""
        self._send(msg.receipt, WPI)

    def keep_alive_interval(self, msg: Message) -> float | None:
        """Half of the consumer's ``ack_wait``."""
        return self._ack_wait / 2

    def max_hold(self, msg: Message) -> float | None:
        """None: in-progress acks keep a message as long as it runs."""
        return None

    # --- writing ---------------------------------------------------------------

    def _send(self, subject: str, payload: bytes, reply: str = "") -> None:
        self._out.append((subject, payload, reply))
        if self._flusher is None:
            loop = self._loop or asyncio.get_running_loop()
            self._flusher = loop.create_task(self._flush())

    async def _flush(self) -> None:
        client = self.connection.client
        try:
            while self._out:
                batch, self._out = self._out, []
                if client is None or client.is_closed:
                    self.connection.errors["closed"] = self.connection.errors.get("closed", 0) + 1
                    log.warning(
                        "%s: %d acks/requests not sent: connection closed", self.name, len(batch)
                    )
                    continue
                for subject, payload, reply in batch:
                    await client.publish(subject, payload, reply=reply)
        except Exception as exc:
            log.warning("%s: writing to NATS failed: %s", self.name, exc)
        finally:
            self._flusher = None
            if self._out:  # written after a failure: try again on a fresh task
                loop = self._loop or asyncio.get_running_loop()
                self._flusher = loop.create_task(self._flush())

    # --- keeping the pull alive ------------------------------------------------

    def _reconnected(self) -> None:
        if self._bound and not self._stopping:
            self._spawn(self._resubscribe())

    async def _resubscribe(self) -> None:
        client = self.connection.client
        if client is not None:
            await self._subscribe(client)
            self._pull()

    async def _watch(self) -> None:
        """Forget requests whose heartbeats stopped (their server went away)."""
        while not self._stopping:
            await asyncio.sleep(HEARTBEAT)
            silent = _monotonic() - self._heard > 2 * HEARTBEAT + 1
            if self._bound and self.requested and silent and self.connection.connected:
                log.info("%s: pull request went silent; asking again", self.name)
                self.requested = 0
                self._heard = _monotonic()
                self._pull()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- stats -----------------------------------------------------------------

    def stats(self) -> SubscriptionStats:
        """In hand, asked for, and the connection's errors."""
        return SubscriptionStats(
            connected=int(self.connection.connected),
            window=self.in_flight + self.requested,
            in_flight=self.in_flight,
            errors=dict(self.connection.errors),
            connections=[
                {
                    "address": self.connection.address,
                    "stream": self.stream,
                    "consumer": self.consumer,
                    "requested": self.requested,
                    "received": self.received,
                }
            ],
        )

    def describe(self) -> dict[str, Any]:
        """Where this subscription reads from (for logs)."""
        return {"nats": self.connection.servers, "stream": self.stream, "consumer": self.consumer}
