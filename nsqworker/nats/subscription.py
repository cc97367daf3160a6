"""One topic/channel on NATS JetStream: a durable pull consumer read by a continuous pull.

The subscription asks the consumer for messages with pull requests sent to an inbox of
its own, and never asks for more than the receiver's free window: in flight plus
requested stays at most the window (``max_in_flight``), so no message waits in this
process while its ``ack_wait`` runs out. A new request goes out when a quarter of the
window is free (or when nothing is requested at all); each asks the server for idle
heartbeats, and a request that went silent (its server died) is forgotten and asked again.

Settling is the JetStream ack protocol on each message's reply subject: ``+ACK``,
``-NAK {"delay": ns}``, ``+TERM`` and ``+WPI`` (in progress: the keep-alive).

The inbox, its messages, the acks and the pull requests travel on a connection of the
subscription's own (:mod:`nsqworker.nats.wire`, the codec of
:mod:`nsqworker.nats.protocol`), to the server the process's nats-py connection is on;
nats-py keeps JetStream management (streams, consumers, their checks). Acks are written
once per loop turn, not one per message; a pull request is written at once, with the
acks settled before it, even in the middle of a read: the server serves it while the
rest of the read is handled (at the end of the read, the pipeline would drain while the
worker is busy and the server idle: about 190k instead of 250k msgs/s with a window of
500). A lost wire is opened again (acks settled meanwhile are written first; requests to
the old inbox die with it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nsqworker.errors import RemoteProtocolError
from nsqworker.message import Message
from nsqworker.nats import protocol
from nsqworker.nats.jetstream import (
    ack_wait,
    check_channel,
    check_subject,
    consumer_name,
    ensure_consumer,
    ensure_stream,
)
from nsqworker.nats.wire import Wire, open_wire
from nsqworker.reconnect import reconnect_delay
from nsqworker.subscription_kit import SubscriptionKit
from nsqworker.transport import Flow, Receiver, SubscriptionStats

if TYPE_CHECKING:
    from nsqworker.nats.client import NatsConnection
    from nsqworker.settings.nats import NatsSettings as Settings

__all__ = ["NatsSubscription"]

log = logging.getLogger("nsqworker.nats")

EXPIRES = 30.0
"""Seconds a pull request waits on the server for messages."""
HEARTBEAT = 5.0
"""Seconds between the server's idle heartbeats on a waiting pull request."""
ACK, NAK, TERM, WPI = b"+ACK", b"-NAK", b"+TERM", b"+WPI"
SID = 1
"""The inbox's subscription id on the subscription's own wire."""
_STATUSES = frozenset({"404", "408", "409", "503"})
"""Statuses the server ends a pull request with (no messages, expired, limits reached or
consumer deleted, no responders); any other is dropped. "Deleted" and "no responders"
are checked with the server before the consumer is created again."""
_monotonic = time.monotonic


class NatsSubscription(SubscriptionKit):
    """``topic`` (a subject) read by the durable consumer ``channel``; see the module."""

    _log = log

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
        super().__init__(
            check_subject(topic), check_channel(channel), name=name, window=max_in_flight,
            errors=connection.errors,
        )  # fmt: skip
        self.settings = settings
        self.connection = connection
        self._step = max(1, max_in_flight // 4)
        self._stream = ""
        self.stream: str | None = None
        self.consumer: str | None = None
        self.in_flight = 0
        self.requested = 0
        self.received = 0
        self._wire: Wire | None = None
        self._subbed = False
        self._inbox = ""
        self._next = b""
        self._ack_prefix = b""
        self._bound = False
        self._backlog: list[bytes] = []
        self._rewiring = False
        self._heard = _monotonic()
        self._forget_listener: Callable[[], None] | None = None
        self._ack_wait = ack_wait(settings)
        self._delays = (settings.reconnect_delay, settings.max_reconnect_delay)
        self._address = ""
        self._checking = False
        self._dropped_logged = -60.0

    # --- lifecycle -------------------------------------------------------------

    async def start(self, receiver: Receiver) -> None:
        """Connect, find or create the stream and the channel's consumer, and pull.

        A refused login or stream set-up raises ``ConfigurationError``; a server that
        does not answer is retried in the background (``ready`` stays False).
        """
        if not self._starting(receiver):
            return
        self._forget_listener = self.connection.on_reconnect(self._reconnected)
        await self._first_attempt(self._bind, self._is_bound, self._delays, "NATS")
        self._spawn(self._watch())

    async def _bind(self) -> None:
        await self.connection.get()
        js = await self.connection.jetstream()
        self.stream = await ensure_stream(js, self.topic, self.settings)
        self.consumer = await consumer_name(js, self.stream, self.topic, self.channel)
        self._ack_wait = await ensure_consumer(
            js, self.stream, self.topic, self.consumer, self.settings
        )
        self._next = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}".encode()
        self._ack_prefix = f"$JS.ACK.{self.stream}.{self.consumer}.".encode()
        self._stream = self.stream
        if self._wire is None or not self._wire.open:
            await self._open_wire()
        self.requested = 0  # requests of a consumer deleted since died with it
        self._bound = True
        log.info("%s: bound to consumer %s of stream %s", self.name, self.consumer, self.stream)
        self._pull()

    async def _open_wire(self) -> None:
        """A wire of our own to the server nats-py is on, with a fresh inbox on it."""
        old, self._wire, self._subbed = self._wire, None, False
        if old is not None:
            old.close()
        self.requested = 0  # requests to the old inbox die with it (no interest)
        client = self.connection.client
        url = client.connected_url if client is not None else None
        scheme = url.scheme if url is not None else "nats"
        wire = await open_wire(
            self.settings, self.connection.address, scheme=scheme, name=self.connection.name,
            on_msg=self._on_msg, on_lost=self._wire_lost,
        )  # fmt: skip
        self._inbox = f"_INBOX.{secrets.token_hex(11)}"
        wire.send(protocol.sub(self._inbox.encode(), SID))
        backlog, self._backlog = self._backlog, []
        for data in backlog:  # settled while no wire was open: ack subjects outlive it
            wire.send(data)
        self._wire, self._subbed, self._address = wire, True, wire.address
        self._heard = _monotonic()

    def _wire_lost(self, exc: BaseException | None) -> None:
        self._count_error("disconnected")
        self._subbed = False
        self.requested = 0
        if not self._stopping:
            log.warning(
                "%s: connection to NATS lost (%s); reconnecting", self.name, exc or "closed"
            )
            self._rewire()

    def _rewire(self) -> None:
        if not self._rewiring and not self._stopping:
            self._rewiring = True
            self._spawn(self._rewire_until_done())

    async def _rewire_until_done(self) -> None:
        failures = 0
        try:
            while not self._stopping and (self._wire is None or not self._wire.open):
                if self.connection.connected:
                    try:
                        await self._open_wire()
                        log.info("%s: reconnected to %s", self.name, self._wire_address)
                        break
                    except Exception as exc:
                        log.warning("%s: NATS not ready (%s); retrying", self.name, exc)
                failures += 1
                await asyncio.sleep(reconnect_delay(failures, *self._delays))
        finally:
            self._rewiring = False
        self._pull()

    @property
    def inbox(self) -> str:
        """The subject the server sends this subscription's messages to (a fresh one
        with each connection)."""
        return self._inbox

    @property
    def _wire_address(self) -> str:
        wire = self._wire
        return wire.address if wire is not None else self.connection.address

    def _is_bound(self) -> bool:
        return self._bound

    async def stop(self) -> None:
        """Ask for nothing more, and end the pull: the inbox is drained (UNSUB, then a
        round trip, so the server holds no request for it and every message it sent
        before is read). What arrives goes to the receiver, which, draining, hands it
        back with a NAK for another worker; messages in hand stay settleable."""
        self._stopping = True
        self._flow = Flow.PAUSED
        wire, subbed, self._subbed = self._wire, self._subbed, False
        if wire is not None and subbed and wire.open:
            wire.send(protocol.unsub(SID))
            try:
                await wire.round_trip(5.0)
            except Exception:  # a lost connection: its requests died with it
                log.debug("draining the pull inbox failed", exc_info=True)

    async def close(self) -> None:
        """Write the last acks, and drop the inbox (the server forgets its requests)."""
        self._stopping = True
        if self._forget_listener is not None:
            self._forget_listener()
        self._cancel_tasks()
        wire, self._wire, self._subbed = self._wire, None, False
        if wire is not None:
            if wire.open:
                try:  # the last acks are written and read by the server
                    await wire.round_trip(2.0)
                except Exception:
                    log.debug("flushing the last acks failed", exc_info=True)
            wire.close()
        if self._backlog:
            log.warning("%s: %d acks not sent: connection closed", self.name, len(self._backlog))
            self._backlog = []
        self._bound = False

    @property
    def subscribed(self) -> bool:
        """True while bound to the consumer and connected."""
        wire = self._wire
        return self._bound and wire is not None and wire.open and (self._subbed or self._stopping)

    # --- flow ------------------------------------------------------------------

    def set_flow(self, flow: Flow, window: int) -> None:
        """The receiver's flow: at most ``window`` (1 when probing, 0 paused) asked for
        or in hand."""
        self._flow, self.window, self._step = flow, window, max(1, window // 4)
        self._pull()

    def _pull(self) -> None:
        if not self._bound:
            return
        allowed = self._allowed()
        room = allowed - self.in_flight - self.requested
        if room <= 0 or (self.requested and room < max(1, allowed // 4)):
            return
        wire = self._wire
        if wire is None or not self._subbed or not wire.open:
            return  # asked again when the wire is back
        self.requested += room
        request = b'{"batch":%d,"expires":%d,"idle_heartbeat":%d}' % (
            room,
            int(EXPIRES * 1e9),
            int(HEARTBEAT * 1e9),
        )
        wire.send_now(protocol.pub(self._next, request, self._inbox.encode()))

    # --- messages (hot path) ---------------------------------------------------

    def _on_msg(
        self, subject: bytes, sid: int, reply: bytes, headers: bytes | None, payload: bytes
    ) -> None:
        wire = self._wire  # None only while close() lets it go and its last reads arrive
        now = wire.read_at if wire is not None else _monotonic()
        prefix = self._ack_prefix
        if headers is None and sid == SID and reply.startswith(prefix):
            # <delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>, all numbers:
            # anything else was not sent by the server for us
            tail = reply[len(prefix) :].split(b".")
            if len(tail) == 5:
                delivered, seq, cseq, stamp, pending = tail
                if (
                    delivered.isdigit() and seq.isdigit() and stamp.isdigit()
                    and pending.isdigit() and cseq.isdigit()
                ):  # fmt: skip
                    # _take without headers, inline: the hot path of every message
                    if self.requested:
                        self.requested -= 1
                    self.received += 1
                    message = Message(
                        seq, payload, int(stamp), int(delivered), self.topic, self.channel,
                        self._address, self._receiver, reply, now, None,
                    )  # fmt: skip
                    message.origin = (self._stream, int(seq))
                    self.in_flight += 1
                    if self._deliver(message):  # type: ignore[misc]
                        if wire is not None:
                            wire.acks.append(reply)  # the wire flushes after this read
                        else:
                            self._ack(reply)
                        self.in_flight -= 1
                        # _pull() only when it may ask: a quarter of the window free, or
                        # none asked
                        if (
                            not self.requested
                            or self.window - self.in_flight - self.requested >= self._step
                        ):
                            self._pull()
                    return
        self._on_other(reply, headers, payload, sid, now)

    def _take(
        self, seq: bytes, body: bytes, stamp: int, delivered: int, reply: bytes,
        raw: bytes | None, now: float,
    ) -> None:  # fmt: skip
        headers = None
        if raw is not None:
            try:
                headers = protocol.parse_headers(raw).fields
            except RemoteProtocolError as exc:  # the server's own: handled, never lost
                log.warning("%s: message %s has unreadable headers: %s", self.name, seq, exc)
        if self.requested:
            self.requested -= 1
        self.received += 1
        message = Message(
            seq, body, stamp, delivered, self.topic, self.channel, self._address, self._receiver,
            reply, now, headers,
        )  # fmt: skip
        message.origin = (self._stream, int(seq))
        self.in_flight += 1
        if self._deliver(message):  # type: ignore[misc]
            self._ack(reply)
            self.in_flight -= 1
            self._pull()

    def _on_other(
        self, reply: bytes, raw: bytes | None, payload: bytes, sid: int, now: float
    ) -> None:
        """What is not a plain message of this consumer: one with headers, the other form
        of ack subject (with a domain and an account), a status ending a pull request, or
        something forged."""
        if sid != SID:
            return  # a subscription this wire no longer has
        if reply.startswith(self._ack_prefix) and reply.count(b".") == 8:
            tokens = reply.split(b".")
            if all(t.isdigit() for t in tokens[4:9]):
                self._take(tokens[5], payload, int(tokens[7]), int(tokens[4]), reply, raw,
                           now)  # fmt: skip
                return
        if reply.startswith(b"$JS.ACK."):
            tokens = reply.split(b".")
            if len(tokens) >= 12:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>...
                del tokens[2:4]
            if (
                len(tokens) < 9
                or tokens[2].decode("utf-8", "replace") != self.stream
                or tokens[3].decode("utf-8", "replace") != self.consumer
                or not all(t.isdigit() for t in tokens[4:9])
            ):
                self._drop(reply, "an ack subject not of this consumer")
                return
            self._take(tokens[5], payload, int(tokens[7]), int(tokens[4]), reply, raw,
                       now)  # fmt: skip
            return
        if reply:
            self._drop(reply, "a reply subject that is no JetStream ack")
            return
        if raw is None:
            return  # a stray message without headers: the request is alive
        try:
            headers = protocol.parse_headers(raw)
        except RemoteProtocolError:
            self._drop(reply, "unreadable headers")
            return
        # nats-py's status, as its handlers saw it: the status line's, else a Status field
        status = headers.status or headers.fields.get("Status")
        description = headers.description or headers.fields.get("Description", "")
        if status is None or status == "100":
            return  # an idle heartbeat (or a stray message): the request is alive
        if payload or status not in _STATUSES:
            self._drop(reply, f"an unexpected status {status!r}")
            return
        if status == "503" or (status == "409" and "deleted" in description.lower()):
            if not self._checking:  # the consumer may be gone: ask the server, not the message
                self._checking = True
                self._spawn(self._check_consumer())
            return
        left = headers.fields.get("Nats-Pending-Messages")
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
            self._spawn(self._retry_until(self._bind, self._is_bound, self._delays, "NATS"))
            return
        except Exception as exc:
            log.warning("%s: checking consumer %s failed: %s", self.name, self.consumer, exc)
        finally:
            self._checking = False
        self.requested = 0
        self._pull()

    def _drop(self, reply: bytes, what: str) -> None:
        """A message on the pull inbox that the server did not send for this consumer
        (someone who knows the inbox's name published it): never handled, never acked."""
        self._count_error("forged")
        now = _monotonic()
        if now - self._dropped_logged >= 60.0:
            self._dropped_logged = now
            log.warning(
                "%s: dropped a message on the pull inbox with %s (reply %r); not from"
                " consumer %s of stream %s (counted in errors['forged'], logged once a"
                " minute)", self.name, what, reply[:120].decode("utf-8", "replace"),
                self.consumer, self.stream,
            )  # fmt: skip

    def finish(self, msg: Message) -> None:
        """``+ACK``."""
        self._ack(msg.receipt)
        self.in_flight -= 1
        self._pull()

    def retry(self, msg: Message, delay: float) -> None:
        """``-NAK`` with the delay: the server redelivers it after ``delay`` seconds."""
        payload = NAK if delay <= 0 else b'-NAK {"delay":%d}' % int(delay * 1e9)
        self._send(protocol.pub(msg.receipt, payload))
        self.in_flight -= 1
        self._pull()

    def reject(self, msg: Message) -> None:
        """``+TERM``: the server never delivers it again (its dead letter is written)."""
        self._send(protocol.pub(msg.receipt, TERM))
        self.in_flight -= 1
        self._pull()

    def keep_alive(self, msg: Message) -> None:
        """``+WPI`` (work in progress): restarts the message's ``ack_wait``."""
        self._send(protocol.pub(msg.receipt, WPI))

    def keep_alive_interval(self, msg: Message) -> float | None:
        """Half of the consumer's ``ack_wait``."""
        return self._ack_wait / 2

    def max_hold(self, msg: Message) -> float | None:
        """None: in-progress acks keep a message as long as it runs."""
        return None

    # --- writing ---------------------------------------------------------------

    def _ack(self, reply: bytes) -> None:
        """``+ACK`` to ``reply`` on the wire, or kept until a wire is open again."""
        wire = self._wire
        if wire is not None and wire.open:
            wire.ack(reply)
        else:
            self._backlog.append(b"PUB %s 4\r\n+ACK\r\n" % reply)

    def _send(self, data: bytes) -> None:
        """An ack on the wire, or kept until a wire is open again."""
        wire = self._wire
        if wire is not None and wire.open:
            wire.send(data)
        else:
            self._backlog.append(data)

    # --- keeping the pull alive ------------------------------------------------

    def _reconnected(self) -> None:
        """nats-py is back: so may be the server our wire lost."""
        if self._bound and not self._stopping and (self._wire is None or not self._wire.open):
            self._rewire()

    async def _watch(self) -> None:
        """Forget requests whose heartbeats stopped (their server went away); a wire
        silent that long again is taken for dead (a half-open TCP connection)."""
        silent_rounds = 0
        while not self._stopping:
            await asyncio.sleep(HEARTBEAT)
            wire = self._wire
            heard = max(self._heard, wire.read_at if wire is not None else 0.0)
            silent = _monotonic() - heard > 2 * HEARTBEAT + 1
            if not (self._bound and self.requested and silent):
                silent_rounds = 0
                continue
            silent_rounds += 1
            if silent_rounds > 1 and wire is not None and wire.open:
                log.info("%s: NATS connection went silent; reconnecting", self.name)
                wire.close()
                self._wire_lost(None)
                silent_rounds = 0
                continue
            log.info("%s: pull request went silent; asking again", self.name)
            self.requested = 0
            self._heard = _monotonic()
            self._pull()

    # --- stats -----------------------------------------------------------------

    def stats(self) -> SubscriptionStats:
        """In hand, asked for, and the connection's errors."""
        return SubscriptionStats(
            connected=int(self._wire is not None and self._wire.open),
            window=self.in_flight + self.requested,
            in_flight=self.in_flight,
            errors=self._error_counts(),
            connections=[
                {
                    "address": self._wire_address,
                    "stream": self.stream,
                    "consumer": self.consumer,
                    "requested": self.requested,
                    "received": self.received,
                }
            ],
        )
