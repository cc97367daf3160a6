"""NSQ as a transport: subscriptions over nsqd and nsqlookupd, producers, capabilities.

``Settings(transport="nsq")`` (the default) builds an :class:`NsqTransport` from the
settings' nsqd and lookupd addresses, TLS, AUTH and IDENTIFY options. See
``docs/transports.md`` for how NSQ's concepts map onto the task layer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from nsqworker.errors import NoConnection
from nsqworker.message import Message
from nsqworker.nsq import protocol
from nsqworker.nsq.capabilities import CAPABILITIES
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.subscription import NsqSubscription

if TYPE_CHECKING:
    from nsqworker.settings.nsq import NsqSettings as Settings

__all__ = ["CAPABILITIES", "DEAD_LETTER_CHANNEL", "NsqTransport", "TopicNsqd", "find_topic_nsqd"]

log = logging.getLogger("nsqworker.nsq")

DEAD_LETTER_CHANNEL: Final = "nsqworker-dead-letters"
"""The channel the dead-letter tools read an NSQ dead-letter topic through. nsqd gives
a new channel only the messages published after it exists, so the worker makes it on
each task's dead-letter topic before its first dead letter
(:meth:`NsqTransport.retain` on the dead-letter chain's word), and the tools never make it."""


class NsqTransport:
    """NSQ from ``settings``: one connection config shared by every subscription."""

    capabilities = CAPABILITIES
    producer_class = Producer

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = ConnectionConfig.from_settings(settings)
        self._producers: dict[str, Producer] = {}
        self._discovered: DiscoveredPublisher | None = None
        self._kept: set[tuple[str, str]] = set()  # (nsqd, topic) with the tools' channel
        self._keeping = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<NsqTransport {self.describe()}>"

    def check_topic(self, topic: str) -> str:
        """NSQ's topic rule: 1-64 of ``[.a-zA-Z0-9_-]``, optional ``#ephemeral``."""
        return protocol.check_topic(topic)

    def check_channel(self, channel: str) -> str:
        """NSQ's channel rule (as for topics)."""
        return protocol.check_channel(channel)

    def subscribe(
        self, topic: str, channel: str, *, name: str, max_in_flight: int
    ) -> NsqSubscription:
        """A subscription on every nsqd of the settings or of lookupd that has ``topic``."""
        return NsqSubscription(
            topic, channel, self.settings, name=name, max_in_flight=max_in_flight,
            connection_config=self.config,
        )  # fmt: skip

    def publisher(self, near: Message | None = None) -> Producer | DiscoveredPublisher:
        """A producer to the settings' nsqd, else to the nsqd that delivered ``near``,
        else (lookupd only, no message: scheduled ticks) to the nsqd lookupd lists."""
        settings = self.settings
        if near is None and not settings.nsqd_tcp_addresses and settings.lookupd_http_addresses:
            if self._discovered is None:
                self._discovered = DiscoveredPublisher(settings, self.config)
            return self._discovered
        key = "" if self.settings.nsqd_tcp_addresses or near is None else near.address
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = Producer(
                [key] if key else None, settings=self.settings,
                connection_config=self._config_for(key), envelope=False,
            )  # fmt: skip
        return producer

    def results_publisher(self, near: Message | None, envelope: bool) -> Producer:
        """The producer of what handlers publish (``publish_to``, ``Publish``): as
        :meth:`publisher`, but wrapping bodies in the trace envelope (with its send
        span's context) when ``envelope`` is True."""
        key = "" if self.settings.nsqd_tcp_addresses or near is None else near.address
        name = key + " envelope" if envelope else key  # no envelope: publisher()'s own
        producer = self._producers.get(name)
        if producer is None:
            producer = self._producers[name] = Producer(
                [key] if key else None, settings=self.settings,
                connection_config=self._config_for(key), envelope=envelope,
            )  # fmt: skip
        return producer

    def _config_for(self, key: str) -> ConnectionConfig:
        """The settings' nsqd (``""``) get the config; one that delivered a message was
        found through lookupd: AUTH only over TLS (security.md)."""
        return self.config.for_discovered() if key else self.config

    async def retain(self, topic: str, near: Message | None = None) -> None:
        """Keep what is published to ``topic`` for a reader that comes later: make the
        durable channel :data:`DEAD_LETTER_CHANNEL` on it on every nsqd a publish near
        ``near`` may go to (those of the settings; else the one that delivered ``near``;
        else, with no message, each that nsqlookupd lists). A SUB with RDY 0, then CLS:
        nothing is delivered. Done once per nsqd and topic; every nsqd is tried, then the
        first failure is raised. Which topics are kept is the task layer's choice (the
        dead-letter chain's); this is only how NSQ keeps one."""
        direct = list(self.settings.nsqd_tcp_addresses)
        if direct:
            wanted = [(a, self.config) for a in direct]
        elif near is not None:
            wanted = [(near.address, self.config.for_discovered())]
        else:
            found = await discover_nsqd(
                self.settings.lookupd_http_addresses, self.settings.lookupd_allowed_nsqd, 5.0
            )
            wanted = [(a, self.config.for_discovered()) for a in found]
        failed: list[BaseException] = []
        async with self._keeping:
            for address, config in wanted:  # each: one nsqd down leaves the others kept
                if (address, topic) not in self._kept:
                    try:
                        await _make_channel(address, config, topic)
                    except Exception as exc:
                        failed.append(exc)
                    else:
                        self._kept.add((address, topic))
        if failed:
            raise failed[0]

    def describe(self) -> dict[str, str]:
        """The nsqd and nsqlookupd addresses of the settings."""
        described = {}
        if self.settings.nsqd_tcp_addresses:
            described["nsqd"] = ",".join(self.settings.nsqd_tcp_addresses)
        if self.settings.lookupd_http_addresses:
            described["lookupd"] = ",".join(self.settings.lookupd_http_addresses)
        return described

    async def close(self) -> None:
        """Close the producers made for dead letters (and ticks)."""
        producers: list[Any] = list(self._producers.values())
        if self._discovered is not None:
            producers.append(self._discovered)
        self._producers, self._discovered = {}, None
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)


async def _make_channel(address: str, config: ConnectionConfig, topic: str) -> None:
    conn = Connection(address, config)
    try:
        await conn.connect()
        await conn.subscribe(protocol.check_topic(topic), DEAD_LETTER_CHANNEL)
        log.debug("nsqd %s: channel %s on %s kept", address, DEAD_LETTER_CHANNEL, topic)
    finally:
        await conn.close()


class DiscoveredPublisher:
    """Publishes to the nsqd that nsqlookupd's ``/nodes`` lists (validated like the
    worker's discovery: entries checked, ``lookupd_allowed_nsqd``): found at the first
    publish, and again after a publish fails."""

    def __init__(self, settings: Settings, config: ConnectionConfig, timeout: float = 5.0):
        self.settings = settings
        self.config = config
        self.timeout = timeout
        self._producer: Producer | None = None

    async def publish(
        self,
        topic: str,
        body: bytes | str,
        delay: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Publish one message to a listed nsqd; returns once it said OK."""
        producer = await self._current()
        try:
            await producer.publish(topic, body, delay=delay, timeout=timeout)
        except Exception:
            await self._forget()
            raise

    async def publish_many(self, topic: str, bodies: Iterable[bytes | str]) -> None:
        """Publish several messages to a listed nsqd (MPUB)."""
        producer = await self._current()
        try:
            await producer.publish_many(topic, list(bodies))
        except Exception:
            await self._forget()
            raise

    async def close(self) -> None:
        """Close the producer, if one was made."""
        await self._forget()

    async def _current(self) -> Producer:
        if self._producer is None:
            addresses = await discover_nsqd(
                self.settings.lookupd_http_addresses,
                self.settings.lookupd_allowed_nsqd,
                self.timeout,
            )
            self._producer = Producer(
                addresses, settings=self.settings, envelope=False,
                connection_config=self.config.for_discovered(),  # found through lookupd
            )  # fmt: skip
        return self._producer

    async def _forget(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()


async def discover_nsqd(lookupds: Iterable[str], allow: Iterable[str], timeout: float) -> list[str]:
    """The TCP addresses of the nsqd that nsqlookupd ``/nodes`` lists (those matching
    ``allow``, when given); ``NoConnection`` names why none was found."""
    import httpx  # here, not at import: it costs ~60 ms

    from nsqworker.nsq.lookupd import get_json, listed_nsqd, matches_address

    patterns = list(allow)
    found: list[str] = []
    problems: list[str] = []
    headers = {"Accept": "application/vnd.nsq; version=1.0"}
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as http:
        for lookupd in lookupds:
            url = lookupd if "://" in lookupd else f"http://{lookupd}"
            try:
                listed = listed_nsqd(await get_json(http, f"{url.rstrip('/')}/nodes"))
            except (httpx.HTTPError, ValueError) as exc:
                problems.append(f"{lookupd}: {type(exc).__name__}: {exc}")
                continue
            for address in listed:
                if patterns and not matches_address(address, patterns):
                    problems.append(
                        f"{lookupd} lists {address}, not matched by lookupd_allowed_nsqd"
                    )
                elif address not in found:
                    found.append(address)
    if not found:
        shown = f" ({'; '.join(problems)})" if problems else ""
        raise NoConnection(f"no nsqd found through nsqlookupd {', '.join(lookupds)}{shown}")
    return found


@dataclass(frozen=True)
class TopicNsqd:
    """One nsqd to read a topic from, and how far it is trusted (as the worker does).

    ``http`` is its HTTP API (``http://host:port``): the ``http_port`` nsqlookupd
    listed, else, for an nsqd of ``nsqd_tcp_addresses``, its TCP port + 1 (nsqd's
    defaults); None when neither is known. ``direct``: given in ``nsqd_tcp_addresses``.
    """

    address: str
    http: str | None
    direct: bool

    def config(self, base: ConnectionConfig) -> ConnectionConfig:
        """``base`` for an nsqd of ``nsqd_tcp_addresses``; for one nsqlookupd listed,
        the worker's rule (``base.for_discovered()``): AUTH, and so the secret, only
        over TLS unless ``lookupd_auth_without_tls``."""
        return base if self.direct else base.for_discovered()


async def find_topic_nsqd(settings: Settings, topic: str) -> list[TopicNsqd]:
    """The nsqd the worker reads ``topic`` from: every nsqd of ``nsqd_tcp_addresses``,
    then each other nsqd nsqlookupd lists for ``topic``, found by the worker's own poller
    (answers validated and capped, only nsqd matching ``lookupd_allowed_nsqd``), asked
    once. ``NoConnection`` when nsqlookupd is the only source and none answered."""
    from nsqworker.nsq.lookupd import LookupdPoller, default_http_address

    direct = list(settings.nsqd_tcp_addresses)
    found: set[str] | None = None
    http: dict[str, str] = {}
    if settings.lookupd_http_addresses:
        poller = LookupdPoller(
            settings.lookupd_http_addresses, topic, lambda _: None,
            timeout=settings.dial_timeout, allow=settings.lookupd_allowed_nsqd,
        )  # fmt: skip
        try:
            found = await poller.poll()
            http = dict(poller.http_addresses)
        finally:
            await poller.close()
        if found is None and not direct:
            raise NoConnection(
                "no nsqlookupd answered: " + ", ".join(settings.lookupd_http_addresses)
            )
    nsqd = [TopicNsqd(a, http.get(a) or default_http_address(a), True) for a in direct]
    nsqd += [TopicNsqd(a, http.get(a), False) for a in sorted(found or ()) if a not in direct]
    return nsqd
