"""Where an ``@rpc`` endpoint may send a reply, with which options, and how it gives up.

A request names the nsqd (``host:port``) and the topic of its reply. Anyone who can
publish to the endpoint's topic writes those fields, so the endpoint treats them as
untrusted input (docs/security.md):

* **address**: only an nsqd the worker already trusts is ever dialled: the one the
  request came in on, the worker's ``nsqd_tcp_addresses``, the nsqd its nsqlookupd
  list (``/nodes``, cached, validated, only those ``lookupd_allowed_nsqd`` matches
  when set), and ``rpc_reply_addresses`` (``host:port`` patterns).
  Anything else: the request is dead-lettered with a reason naming the address, and
  no connection is opened.
* **credentials**: the AUTH secret and the TLS client certificate go only to the
  first three (addresses from the worker's own settings or its lookupd); an address
  allowed only by a pattern gets a connection without them.
* **topic**: only topics matching ``rpc_reply_topics`` (``rpc_*`` and ``rcp-*`` by
  default: the unique reply topics of RpcClient and of the seed's ensq_rpc), so a request cannot make the endpoint publish,
  with its identity, into any topic it likes.
* **delivery**: a reply that cannot be published within :data:`REPLY_TIMEOUT`
  (the producer retries its connection once within it) is a failed delivery of that
  reply: the request is dead-lettered, without consumer backoff, and the address is
  not tried again for :data:`DOWN_FOR` seconds (requests naming it are dead-lettered
  at once, before the function runs).
* **NATS reply subject** (``transport="nats"``): a request names its reply subject, and
  NATS lets the endpoint publish wherever the worker's own permissions allow: into the
  JetStream API (``$JS.API.STREAM.DELETE.<stream>``) or into a subject a stream
  captures. So an endpoint answers only on a subject matching ``rpc_reply_subjects``
  (``_INBOX.>`` by default: the inboxes NATS clients make for a request; ``*`` matches
  one token, ``>`` the rest) and never on one starting with ``$``, whatever the
  setting says. Any other request is dead-lettered before the function runs, with a
  reason naming the subject, and nothing is published.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, ClassVar, Final

from nsqworker.logging import get_logger
from nsqworker.nsq.lookupd import (
    format_address,
    get_json,
    matches_address,
    parse_producers,
    split_address,
)
from nsqworker.nsq.options import ConnectionConfig
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.tls import ssl_context
from nsqworker.task import Reject

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = [
    "REPLY_TIMEOUT",
    "ReplyOptions",
    "ReplyPolicy",
    "ReplyPool",
    "normalize_address",
    "subject_matches",
]

log = get_logger("nsqworker.rpc")

#: Seconds a reply producer may sit unused before it is closed.
REPLY_IDLE_TIMEOUT: Final = 60.0
#: Seconds a reply may take to be published (dialling included) before it is given up.
REPLY_TIMEOUT: Final = 2.0
#: Seconds an address whose reply failed is not dialled again.
DOWN_FOR: Final = 10.0
#: lookupd's /nodes: answers kept this long; a miss asks again at most this often.
NODES_TTL: Final = 60.0
NODES_MIN_REFRESH: Final = 5.0
NODES_TIMEOUT: Final = 2.0


ReplyOptions = ConnectionConfig
"""The connection options a reply is sent with (opaque to the endpoint: nsqd's)."""


def normalize_address(host: str, port: int | str) -> str:
    """``host:port`` as compared: host lower-case, IPv6 in brackets."""
    return format_address(host.strip("[]").lower(), int(port))


_split = split_address


def subject_matches(subject: str, pattern: str) -> bool:
    """Whether the NATS ``subject`` matches ``pattern``: tokens split on ``.``, ``*``
    matches one token, ``>`` (last) one or more."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, want in enumerate(wanted):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens) or (want != "*" and want != tokens[i]):
            return False
    return len(tokens) == len(wanted)


class ReplyPolicy:
    """Decides, per request, whether and how its reply may be sent (module docstring).

    One per worker Settings (:meth:`for_settings`); :meth:`check` raises
    :class:`~nsqworker.task.Reject` naming what is refused.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.own = {normalize_address(*_split(a)) for a in settings.nsqd_tcp_addresses}
        self.patterns = list(settings.rpc_reply_addresses)
        self.topics = list(settings.rpc_reply_topics)
        self.subjects = list(settings.rpc_reply_subjects)
        self.error_details = settings.rpc_error_details
        self.lookupd = [a if "://" in a else f"http://{a}" for a in settings.lookupd_http_addresses]
        self.allowed_nsqd = list(settings.lookupd_allowed_nsqd)
        full = ConnectionConfig.from_settings(settings)
        dial = min(full.dial_timeout, REPLY_TIMEOUT)
        self.credentialed = dataclasses.replace(full, dial_timeout=dial)
        self.discovered = self.credentialed.for_discovered()
        plain_tls = None
        if full.tls_v1:  # the same CA and verification, no client certificate
            plain_tls = ssl_context(settings.tls_ca_file, None, None, settings.tls_verify)
        self.plain = dataclasses.replace(self.credentialed, auth_secret=None, ssl_context=plain_tls)
        self.nodes: set[str] = set()
        self._nodes_at = float("-inf")
        self._refresh: asyncio.Task[None] | None = None
        self.down: dict[str, float] = {}  # address -> loop time it may be tried again

    # By id: Settings is not hashable. The entry holds the Settings, so its id stays its.
    _policies: ClassVar[dict[int, tuple[Settings, ReplyPolicy]]] = {}

    @classmethod
    def for_settings(cls, settings: Settings) -> ReplyPolicy:
        """The policy of ``settings`` (one per Settings object, shared by its endpoints)."""
        entry = cls._policies.get(id(settings))
        if entry is None:
            if len(cls._policies) >= 64:
                cls._policies.pop(next(iter(cls._policies)))
            entry = cls._policies[id(settings)] = (settings, cls(settings))
        return entry[1]

    async def check(self, host: str, port: int, topic: str, came_from: str) -> ConnectionConfig:
        """The options to reply to ``host:port`` with; Reject when it may not be sent."""
        if not any(fnmatch.fnmatchcase(topic, p) for p in self.topics):
            raise Reject(
                f"reply topic {topic!r} is not allowed (rpc_reply_topics: {self.topics}); "
                "not answered"
            )
        address = normalize_address(host, port)
        loop = asyncio.get_running_loop()
        until = self.down.get(address)
        if until is not None:
            if loop.time() < until:
                raise Reject(
                    f"reply nsqd {address} failed less than {DOWN_FOR:g} s ago; not answered"
                )
            del self.down[address]
        if address in self.own:
            return self.credentialed
        # The request's nsqd, when not in our list, was found through lookupd.
        if address == _normal(came_from) or (
            self.lookupd and await self._known_to_lookupd(address, loop.time())
        ):
            return self.discovered
        if matches_address(address, self.patterns):
            return self.plain
        raise Reject(
            f"reply nsqd {address} is not trusted (not the request's nsqd, not in "
            "nsqd_tcp_addresses, not listed by lookupd, not matched by rpc_reply_addresses); "
            "not dialled, not answered"
        )

    def check_subject(self, subject: str) -> None:
        """Reject a NATS reply ``subject`` that is not an allowed inbox (module docstring)."""
        if subject.startswith("$"):
            raise Reject(
                f"reply subject {subject!r} is a $ subject (the server's API): never "
                "answered; not handled"
            )
        if not any(subject_matches(subject, p) for p in self.subjects):
            raise Reject(
                f"reply subject {subject!r} is not allowed (rpc_reply_subjects: "
                f"{self.subjects}); not handled"
            )

    def failed(self, address: str) -> None:
        """Note that a reply to ``address`` could not be delivered."""
        self.down[address] = asyncio.get_running_loop().time() + DOWN_FOR
        if len(self.down) > 4096:  # patterns may allow many addresses: keep it bounded
            self.down.pop(next(iter(self.down)))

    async def _known_to_lookupd(self, address: str, now: float) -> bool:
        age = now - self._nodes_at
        if address in self.nodes and age < NODES_TTL:
            return True
        if age >= NODES_MIN_REFRESH:
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.get_running_loop().create_task(self._fetch_nodes())
            await asyncio.shield(self._refresh)
        return address in self.nodes

    def _allowed(self, address: str) -> bool:
        """Whether ``lookupd_allowed_nsqd`` (when set) lets the worker use this nsqd."""
        return not self.allowed_nsqd or matches_address(address, self.allowed_nsqd)

    async def _fetch_nodes(self) -> None:
        import httpx  # here, not at import: it costs ~60 ms

        found: set[str] = set()
        answered = False
        headers = {"Accept": "application/vnd.nsq; version=1.0"}
        async with httpx.AsyncClient(timeout=NODES_TIMEOUT, headers=headers) as client:
            for base in self.lookupd:
                try:
                    payload = await get_json(client, f"{base.rstrip('/')}/nodes")
                    listed = parse_producers(payload)
                    found |= {normalize_address(*_split(a)) for a in listed if self._allowed(a)}
                    answered = True
                except (httpx.HTTPError, ValueError) as exc:
                    log.warning("lookupd /nodes failed", lookupd=base, error=str(exc))
        if answered:
            self.nodes = found
        self._nodes_at = asyncio.get_running_loop().time()


def _normal(address: str) -> str:
    host, port = _split(address)
    return normalize_address(host, port) if port.isdigit() else address


class ReplyPool:
    """One :class:`Producer` per reply nsqd, made on first use, closed when idle.

    One pool per event loop (:meth:`for_loop`). A sweeper task closes, every
    ``idle_timeout`` seconds, the producers unused since its last round; when the loop
    shuts down (``asyncio.run`` cancels its tasks) the sweeper closes every producer
    left. A producer whose publish failed is closed at once (:meth:`drop`).
    """

    def __init__(self, idle_timeout: float = REPLY_IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        self._producers: dict[tuple[str, int, int], Producer] = {}
        self._used: set[tuple[str, int, int]] = set()  # since the last sweep
        self._sweeper: asyncio.Task[None] | None = None

    _pools: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyPool]] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def for_loop(cls) -> ReplyPool:
        """The pool of the running event loop."""
        loop = asyncio.get_running_loop()
        pool = cls._pools.get(loop)
        if pool is None:
            pool = cls._pools[loop] = cls()
        return pool

    def __len__(self) -> int:
        return len(self._producers)

    def send(
        self,
        host: str,
        port: int,
        topic: str,
        body: bytes,
        config: ConnectionConfig | None = None,
        timeout: float = REPLY_TIMEOUT,
    ) -> Awaitable[None]:
        """Publish ``body`` to ``topic`` on the nsqd at ``host:port``; await the result.

        ``config`` (TLS, AUTH, timeouts) is used when a producer must be made: the
        endpoint passes the one its :class:`ReplyPolicy` chose for the address."""
        key = (host, port, id(config))  # one producer per address and options
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = Producer(
                format_address(host, port), connection_config=config, envelope=False,
                timeout=timeout,
            )  # fmt: skip
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        self._used.add(key)
        return producer.publish(topic, body)

    async def drop(self, host: str, port: int, config: ConnectionConfig | None = None) -> None:
        """Close the producer to ``host:port`` (its publish failed: stop redialling)."""
        producer = self._producers.pop((host, port, id(config)), None)
        if producer is not None:
            await producer.close(timeout=0.5)

    async def close(self) -> None:
        """Close every producer now."""
        producers = list(self._producers.values())
        self._producers.clear()
        self._used.clear()
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)

    async def _sweep(self) -> None:
        try:
            while self._producers:
                await asyncio.sleep(self.idle_timeout)
                for key in [k for k in self._producers if k not in self._used]:
                    await self._producers.pop(key).close()
                self._used.clear()
        except asyncio.CancelledError:  # the loop is shutting down: leave nothing open
            await self.close()
            raise
