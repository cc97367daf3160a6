"""Dead letters on NSQ: read through a channel of the tool's own, handed back unchanged.

nsqd has no peek. The tools read a dead-letter topic through the durable channel
:data:`CHANNEL`, which workers make on each task's dead-letter topic when they start:
from then on nsqd keeps a copy of every new dead letter there, whatever other channels
of the topic do with theirs. Reading never makes a topic or a channel: the nsqd to read
are found as the worker finds them (:func:`~nsqworker.nsq.transport.find_topic_nsqd`:
the settings' nsqd and those nsqlookupd lists for the topic, with the worker's trust
rules for each), each one's HTTP ``/stats`` (which creates nothing) says whether it has
the topic and the channel, and a read subscribes only where both exist. A topic that
exists nowhere lists empty, with a note; one that exists only without the channel is
refused (:class:`DeadLetterChannelMissing`).

A read takes every message into flight (RDY up to nsqd's ``max_rdy_count``) and stops
when nothing new came for ``quiet`` seconds; RDY drops to 0 at once, so nothing comes
back to us. Leaving the store hands back every message not removed with ``REQ 0``,
oldest first, then closes with CLS (whose CLOSE_WAIT answer follows every FIN and REQ
before it). A removal is a FIN. A tool that dies holding messages leaves them in flight:
nsqd puts them back after the connection's message timeout (``msg_timeout``). Listings
are sorted by the time nsqd took each dead letter (its message timestamp, kept across
requeues), so the order shown never depends on how nsqd's queue was rotated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from nsqworker.admin.stores import QUIET, Stored
from nsqworker.errors import ConfigurationError, NoConnection, NSQDError, NSQWorkerError
from nsqworker.nsq import protocol
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.lookupd import default_http_address, get_json
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.transport import DEAD_LETTER_CHANNEL, TopicNsqd, find_topic_nsqd

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["CHANNEL", "DeadLetterChannelMissing", "NsqStore", "TopicUncheckable"]

log = logging.getLogger("nsqworker.admin")

CHANNEL: Final = DEAD_LETTER_CHANNEL
"""The channel the dead-letter tools read a topic through (durable: it keeps them)."""


class DeadLetterChannelMissing(ConfigurationError):
    """The dead-letter topic exists on nsqd, but not the tools' channel :data:`CHANNEL`:
    nothing was kept for the tools there, and a read would make the channel."""


class TopicUncheckable(ConfigurationError):
    """Whether the topic and :data:`CHANNEL` exist on an nsqd of the settings cannot be
    told (its HTTP API did not answer): nothing was subscribed."""


class _Held:
    __slots__ = ("address", "body", "id", "timestamp")

    def __init__(self, address: str, timestamp: int, message_id: bytes, body: bytes) -> None:
        self.address = address
        self.timestamp = timestamp
        self.id = message_id
        self.body = body


class NsqStore:
    """A dead-letter topic on NSQ; see the module docstring."""

    def __init__(self, settings: Settings, topic: str, *, quiet: float = QUIET) -> None:
        self.settings = settings
        self.topic = protocol.check_topic(topic)
        self.quiet = quiet
        self.config = ConnectionConfig.from_settings(settings)
        self._connections: dict[str, Connection] = {}
        # every message nsqd gave us, by (nsqd, id): a message delivered again (its timeout
        # passed) is the same message, held once
        self._taken: dict[tuple[str, bytes], _Held] = {}
        self._held: dict[str, _Held] = {}  # the read's, by their Stored id
        self._removed: set[_Held] = set()
        self._producers: dict[str, Producer] = {}
        self._last_message = 0.0
        self._errors: list[NSQDError] = []
        self._toucher: asyncio.Task[None] | None = None
        self.notes: list[str] = []
        self._failed_fins: dict[tuple[str, bytes], str] = {}
        self._keys: dict[str, _Held] = {}  # every id handed out, kept after close

    async def __aenter__(self) -> NsqStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def nsqd(self) -> list[TopicNsqd]:
        """The nsqd to read: those where both the topic and :data:`CHANNEL` exist, of the
        nsqd the worker would read the topic from (nothing is created to find out)."""
        settings = self.settings
        if not settings.nsqd_tcp_addresses and not settings.lookupd_http_addresses:
            raise ConfigurationError(
                "no nsqd address: pass --nsqd HOST:PORT or --lookupd URL, or set"
                " NSQWORKER_NSQD_TCP_ADDRESSES"
            )
        found = await find_topic_nsqd(settings, self.topic)
        if not found:
            lookupds = ", ".join(settings.lookupd_http_addresses)
            self.notes.append(f"{self.topic} does not exist on any nsqd nsqlookupd {lookupds}"
                              " lists for it: nothing was dead-lettered there")  # fmt: skip
            return []
        import httpx

        async with httpx.AsyncClient(timeout=settings.dial_timeout, trust_env=False) as http:
            states = await asyncio.gather(*(self._state(http, n) for n in found))
        ready, bare, checked = [], [], []
        for nsqd, state in zip(found, states, strict=True):
            if isinstance(state, str):
                if nsqd.direct:
                    await self._reachable(nsqd.address)  # down: NoConnection, not this
                    raise TopicUncheckable(state)
                self.notes.append(f"nsqd {nsqd.address} (listed by nsqlookupd) was not read: "
                                  + state)  # fmt: skip
                continue
            checked.append(nsqd.address)
            topic, channel = state
            if topic and channel:
                ready.append(nsqd)
            elif topic:
                bare.append(nsqd.address)
        if bare and not ready:
            raise DeadLetterChannelMissing(_no_channel(self.topic, bare))
        if bare:
            self.notes.append(
                f"{self.topic} exists on nsqd {', '.join(bare)} without the channel {CHANNEL}:"
                " dead letters there were not kept for the tools and were not read (workers"
                " make the channel on their dead-letter topics when they start)"
            )
        if checked and not ready and not bare:
            self.notes.append(f"{self.topic} does not exist on nsqd {', '.join(checked)}:"
                              " nothing was dead-lettered there")  # fmt: skip
        return ready

    async def _reachable(self, address: str) -> None:
        """Raise NoConnection unless nsqd's TCP port accepts a connection (closed at
        once, before any command: nothing is created)."""
        host, _, port = address.rpartition(":")
        try:
            async with asyncio.timeout(self.settings.dial_timeout):
                _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except (OSError, TimeoutError) as exc:
            raise NoConnection(f"cannot connect to nsqd at {address}: {exc}") from exc
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def _state(self, http: Any, nsqd: TopicNsqd) -> tuple[bool, bool] | str:
        """Whether ``nsqd`` has the topic and :data:`CHANNEL`, from its ``/stats``; or why
        that cannot be told."""
        import httpx

        why = ""
        if nsqd.http is None:
            why = "nsqlookupd gave no HTTP port for it"
        else:
            # by topic only: nsqd leaves out a topic that lacks the channel asked for
            params = {"format": "json", "topic": self.topic, "include_clients": "false"}
            try:
                return _has(await get_json(http, f"{nsqd.http}/stats", params), self.topic)
            except (httpx.HTTPError, ValueError) as exc:
                why = f"its HTTP API {nsqd.http}"
                if nsqd.direct and nsqd.http == default_http_address(nsqd.address):
                    why += " (taken as its TCP port + 1, nsqd's default)"
                why += f" did not answer /stats: {type(exc).__name__}: {exc}"
        hint = (" Run nsqd with its HTTP port at its TCP port + 1, or reach it through"
                " nsqlookupd (--lookupd), which tells each nsqd's HTTP port."
                if nsqd.direct else "")  # fmt: skip
        return (
            f"cannot check whether {self.topic} and its channel {CHANNEL} exist on nsqd"
            f" {nsqd.address}, so nothing was subscribed there (a SUB would create both):"
            f" {why}.{hint}"
        )

    async def read(self, limit: int | None = None) -> list[Stored]:
        """Every dead letter on every nsqd, oldest first (all are read: nsqd's order is
        not the age order); at most ``max_rdy_count`` per nsqd (2500 by default)."""
        loop = asyncio.get_running_loop()
        for nsqd in await self.nsqd():
            address = nsqd.address
            conn = Connection(
                address,
                nsqd.config(self.config),  # the worker's trust rules for this nsqd
                on_message=self._taker(address),
                on_error=self._on_error,
            )
            try:
                await conn.connect()
                await conn.subscribe(self.topic, CHANNEL)
            except NSQWorkerError as exc:
                await conn.close()
                if nsqd.direct:
                    raise
                self.notes.append(f"nsqd {address} (listed by nsqlookupd) was not read: {exc}")
                continue
            self._connections[address] = conn
            conn.rdy(conn.server.max_rdy_count)
        self._last_message = loop.time()
        self._toucher = asyncio.create_task(self._keep_alive())
        while (idle := loop.time() - self._last_message) < self.quiet:
            await asyncio.sleep(self.quiet - idle)
        for conn in self._connections.values():
            if conn.connected:
                conn.rdy(0)
        full = [
            a for a, c in self._connections.items()
            if sum(h.address == a for h in self._taken.values()) >= c.server.max_rdy_count
        ]  # fmt: skip
        if full:
            self.notes.append(
                f"nsqd {', '.join(full)} may hold more dead letters of {self.topic} than one"
                " client may take at once (its --max-rdy-count): these are the first ones;"
                " the others show once these are replayed or purged"
            )
        items = sorted(self._taken.values(), key=_age)
        ids = [h.id.decode("ascii", "replace") for h in items]
        counts = Counter(ids)
        twice = {i for i, n in counts.items() if n > 1}  # the same id on two nsqd
        stored = []
        for held, message_id in zip(items, ids, strict=True):
            key = f"{message_id}@{held.address}" if message_id in twice else message_id
            self._held[key] = self._keys[key] = held
            when = datetime.fromtimestamp(held.timestamp / 1e9, UTC)
            stored.append(Stored(key, held.body, when, held.address))
        return stored if limit is None else stored[:limit]

    def _taker(self, address: str) -> Any:
        loop = asyncio.get_running_loop()

        def take(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> None:
            self._taken.setdefault(
                (address, message_id), _Held(address, timestamp, message_id, body)
            )
            self._last_message = loop.time()

        return take

    async def _keep_alive(self) -> None:
        """TOUCH what is held every third of its connection's message timeout, so a long
        replay keeps its messages (up to nsqd's ``--max-msg-timeout``)."""
        while True:
            timeouts = [c.server.msg_timeout for c in self._connections.values()] or [60.0]
            await asyncio.sleep(max(0.5, min(timeouts) / 3))
            for held in list(self._taken.values()):
                conn = self._connections.get(held.address)
                if held not in self._removed and conn is not None and conn.connected:
                    conn.touch(held.id)

    @property
    def errors(self) -> list[NSQDError]:
        """nsqd's non-fatal errors so far (``E_FIN_FAILED``, ``E_TOUCH_FAILED``...)."""
        return list(self._errors)

    def _on_error(self, conn: Connection, error: NSQDError) -> None:
        self._errors.append(error)
        log.warning("nsqd %s: %s", conn.address, error)
        if error.code == "E_FIN_FAILED":  # message: "FIN <id> failed ..."
            parts = error.message.split()
            if len(parts) > 1:
                self._failed_fins[(conn.address, parts[1].encode())] = error.message

    @property
    def failed_removals(self) -> dict[str, str]:
        """Removals nsqd refused (``E_FIN_FAILED``: the message was no longer held,
        its timeout had passed), by id, with nsqd's words; complete once closed."""
        return {
            key: f"nsqd refused the FIN: {self._failed_fins[(h.address, h.id)]}"
            for key, h in self._keys.items()
            if (h.address, h.id) in self._failed_fins
        }

    async def remove(self, item: Stored) -> None:
        """FIN the dead letter (nsqd drops it)."""
        held = self._held.get(item.id)
        if held is None or held in self._removed:
            raise KeyError(f"dead letter {item.id} is not held")
        self._connections[held.address].fin(held.id)
        self._removed.add(held)

    def publisher(self, item: Stored) -> Producer:
        """The settings' nsqd, else the nsqd that holds ``item`` (found through lookupd,
        so AUTH goes to it only over TLS, as from the worker)."""
        key = "" if self.settings.nsqd_tcp_addresses else item.where
        if key not in self._producers:
            config = self.config.for_discovered() if key else self.config
            self._producers[key] = Producer(
                [key] if key else None, settings=self.settings, connection_config=config,
                envelope=False,
            )  # fmt: skip
        return self._producers[key]

    async def publish(self, item: Stored, topic: str, body: bytes) -> None:
        """Publish through :meth:`publisher` (nsqd de-duplicates nothing)."""
        await self.publisher(item).publish(topic, body)

    async def close(self) -> None:
        """Hand back every message not removed (REQ 0, oldest first), CLS, close."""
        if self._toucher is not None:
            self._toucher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._toucher
        for held in sorted(self._taken.values(), key=_age):
            conn = self._connections.get(held.address)
            if held not in self._removed and conn is not None and conn.connected:
                conn.req(held.id, 0)
        self._taken, self._held, self._removed = {}, {}, set()
        connections, self._connections = list(self._connections.values()), {}
        producers, self._producers = list(self._producers.values()), {}
        for conn in connections:
            with contextlib.suppress(Exception):
                await conn.close()
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)


def _has(stats: Any, topic: str) -> tuple[bool, bool]:
    """Whether nsqd's ``/stats?topic=`` answer shows the topic, and in it :data:`CHANNEL`
    (nsqd 1.x answers at the top level, older ones under ``data``; ``topics`` is null
    when nsqd has none)."""
    data = stats.get("data", stats) if isinstance(stats, dict) else None
    topics = data.get("topics", ()) if isinstance(data, dict) else None
    topics = [] if topics is None and isinstance(data, dict) else topics
    if not isinstance(topics, list):
        raise ValueError(f"not an nsqd /stats answer: {stats!r:.200}")
    for item in topics:
        if isinstance(item, dict) and item.get("topic_name") == topic:
            channels = item.get("channels")
            names = [c.get("channel_name") for c in channels or () if isinstance(c, dict)]
            return True, CHANNEL in names
    return False, False


def _no_channel(topic: str, nsqd: list[str]) -> str:
    return (
        f"{topic} exists on nsqd {', '.join(nsqd)} but has no channel {CHANNEL}: dead letters"
        f" are kept for the tools only on topics where that channel was made first, before"
        f" the dead letters came (those published earlier are only in the topic's other"
        f" channels). Workers make it on each task's NSQ dead-letter topic when they start;"
        f" to make it by hand: curl -X POST"
        f" 'http://NSQD_HTTP/channel/create?topic={topic}&channel={CHANNEL}'. Nothing was"
        f" subscribed: a read does not make it (it would hold copies of every later message"
        f" of the topic)"
    )


def _age(held: _Held) -> tuple[int, bytes, str]:
    return held.timestamp, held.id, held.address
