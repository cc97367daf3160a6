"""Dead letters on NSQ: read through a channel of the tool's own, handed back unchanged.

nsqd has no peek. The tools read a dead-letter topic through the durable channel
:data:`CHANNEL` (created on first use: from then on nsqd keeps a copy of every new dead
letter there, whatever other channels of the topic do with theirs). A read subscribes
on every nsqd that has the topic (the settings' nsqd, or those nsqlookupd names), takes
every message into flight (RDY up to nsqd's ``max_rdy_count``), and stops when nothing
new came for ``quiet`` seconds; RDY drops to 0 at once, so nothing comes back to us.

Leaving the store hands back every message not removed with ``REQ 0``, oldest first,
then closes with CLS (whose CLOSE_WAIT answer follows every FIN and REQ before it). A
removal is a FIN. A tool that dies holding messages leaves them in flight: nsqd puts
them back after the connection's message timeout (``msg_timeout``). Listings are
sorted by the time nsqd took each dead letter (its message timestamp, kept across
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
from nsqworker.nsq.lookupd import get_json, parse_producers
from nsqworker.nsq.producer import Producer

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["CHANNEL", "NsqStore"]

log = logging.getLogger("nsqworker.admin")

CHANNEL: Final = "nsqworker-dead-letters"
"""The channel the dead-letter tools read a topic through (durable: it keeps them)."""


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

    async def addresses(self) -> list[str]:
        """The nsqd to read: the settings' nsqd, or each that nsqlookupd lists for the topic."""
        if self.settings.nsqd_tcp_addresses:
            return list(self.settings.nsqd_tcp_addresses)
        if not self.settings.lookupd_http_addresses:
            raise ConfigurationError(
                "no nsqd address: pass --nsqd HOST:PORT or --lookupd URL, or set"
                " NSQWORKER_NSQD_TCP_ADDRESSES"
            )
        import httpx

        found: set[str] = set()
        answered = False
        async with httpx.AsyncClient(timeout=self.settings.dial_timeout) as client:
            for base in self.settings.lookupd_http_addresses:
                url = f"{base.rstrip('/')}/lookup"
                try:
                    found |= parse_producers(await get_json(client, url, {"topic": self.topic}))
                    answered = True
                except httpx.HTTPStatusError as exc:
                    answered = answered or exc.response.status_code == 404  # no such topic
                except (httpx.HTTPError, ValueError) as exc:
                    log.warning("nsqlookupd %s: %s", base, exc)
        if not answered:
            raise NoConnection(
                "no nsqlookupd answered: " + ", ".join(self.settings.lookupd_http_addresses)
            )
        return sorted(found)

    async def read(self, limit: int | None = None) -> list[Stored]:
        """Every dead letter on every nsqd, oldest first (all are read: nsqd's order is
        not the age order); at most ``max_rdy_count`` per nsqd (2500 by default)."""
        loop = asyncio.get_running_loop()
        for address in await self.addresses():
            conn = Connection(
                address, self.config, on_message=self._taker(address), on_error=self._on_error
            )
            try:
                await conn.connect()
                await conn.subscribe(self.topic, CHANNEL)
            except NSQWorkerError:
                await conn.close()
                raise
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
        """The settings' nsqd, else the nsqd that holds ``item`` (found through lookupd)."""
        key = "" if self.settings.nsqd_tcp_addresses else item.where
        if key not in self._producers:
            self._producers[key] = Producer(
                [key] if key else None, settings=self.settings, envelope=False
            )
        return self._producers[key]

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


def _age(held: _Held) -> tuple[int, bytes, str]:
    return held.timestamp, held.id, held.address
