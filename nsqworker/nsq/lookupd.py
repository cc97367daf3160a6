"""Discovery: poll every nsqlookupd for a topic's producers, with jitter.

nsqlookupd instances do not coordinate (each nsqd registers with all of them), so the
producers of every answer are unioned. A lookupd that fails is logged and skipped; if
every one fails, the last known set is kept rather than dropping live connections
because discovery had a bad minute.

While lookupd knows no producer of the topic (nobody has published it yet), the poller
asks sooner: after 1 s, then 2, 4, ... up to the regular interval, and says once that
the topic has no producers yet, so a newcomer's first message is not a minute away.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = [
    "LookupdPoller",
    "default_http_address",
    "format_address",
    "get_json",
    "listed_nsqd",
    "matches_address",
    "parse_producers",
    "split_address",
]

log = logging.getLogger("nsqworker.nsq.lookupd")


def format_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def default_http_address(tcp_address: str) -> str:
    """``http://host:port+1`` for nsqd at ``host:port``: its HTTP API by nsqd's default
    ports (4150 and 4151), for an nsqd known only by its TCP address."""
    host, _, port = tcp_address.rpartition(":")
    return f"http://{host}:{int(port) + 1}"


#: Bytes of a lookupd answer read at most, and producers taken from one answer: a
#: broken or hostile lookupd cannot make a worker hold more.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_PRODUCERS = 10_000


async def get_json(
    client: httpx.AsyncClient, url: str, params: dict[str, str] | None = None
) -> Any:
    """GET ``url`` and parse its JSON, reading at most :data:`MAX_ANSWER_BYTES`.

    Raises httpx.HTTPStatusError for a non-2xx answer, ValueError for a body that is
    too large or not JSON."""
    async with client.stream("GET", url, params=params) as response:
        response.raise_for_status()
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise ValueError(f"answer larger than {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"answer is not JSON: {exc}") from None


def split_address(address: str) -> tuple[str, str]:
    """``(host, port)`` of ``host:port`` as compared: lower-case, no IPv6 brackets."""
    host, _, port = address.rpartition(":")
    return host.strip("[]").lower(), port


def matches_address(address: str, patterns: Iterable[str]) -> bool:
    """Whether ``host:port`` matches one of ``patterns`` (``*`` and ``?`` wildcards in
    the host and the port, compared apart so IPv6 brackets are no character class)."""
    host, port = split_address(address)
    for pattern in patterns:
        want_host, want_port = split_address(pattern)
        if fnmatch.fnmatchcase(host, want_host) and fnmatch.fnmatchcase(port, want_port):
            return True
    return False


def _producer_list(payload: Any) -> list[Any]:
    if not isinstance(payload, dict):
        raise ValueError(f"lookupd answer is not a JSON object: {payload!r:.200}")
    data = payload.get("data", payload)
    if not isinstance(data, dict):
        raise ValueError(f"lookupd answer has no producers: {payload!r:.200}")
    producers = data.get("producers") or []
    if not isinstance(producers, list):
        raise ValueError(f"lookupd answer's producers is not a list: {producers!r:.200}")
    if len(producers) > MAX_PRODUCERS:
        raise ValueError(f"lookupd lists {len(producers)} producers, more than {MAX_PRODUCERS}")
    return producers


def _host_port(producer: Any, key: str) -> tuple[str, int] | None:
    """``(host, port)`` of one producer entry, or None when it is malformed."""
    if not isinstance(producer, dict):
        return None
    host = producer.get("broadcast_address") or producer.get("address")
    port = producer.get(key)
    if not isinstance(host, str) or not host or len(host) > 255 or any(c in host for c in " /@"):
        return None
    if type(port) is not int or not 0 < port < 65536:
        return None
    return host, port


def parse_producers(payload: Any) -> set[str]:
    """The ``broadcast_address:tcp_port`` of each producer in a /lookup or /nodes answer.

    Accepts nsqlookupd v1 answers (``{"producers": [...]}``) and the older wrapped form
    (``{"status_code": 200, "data": {"producers": [...]}}``). Entries that are not a
    host and a port are skipped; an answer that is not this shape raises ValueError.
    """
    return set(listed_nsqd(payload))


def listed_nsqd(payload: Any) -> dict[str, str | None]:
    """``{tcp host:port: http host:port or None}`` of the producers in a /lookup or
    /nodes answer, in lookupd's order; validated like :func:`parse_producers`."""
    found: dict[str, str | None] = {}
    for producer in _producer_list(payload):
        tcp, http = _host_port(producer, "tcp_port"), _host_port(producer, "http_port")
        if tcp is not None:
            found.setdefault(format_address(*tcp), None if http is None else format_address(*http))
    return found


def http_addresses(payload: Any) -> dict[str, str]:
    """``{tcp address: "http://host:http_port"}`` of the producers in a /lookup answer."""
    return {tcp: f"http://{web}" for tcp, web in listed_nsqd(payload).items() if web is not None}


class LookupdPoller:
    """Polls nsqlookupd ``/lookup?topic=`` and reports the union of producers.

    ``on_update(addresses)`` is called after every round in which at least one lookupd
    answered. ``run()`` polls at once, then every ``interval`` seconds with up to
    ``jitter x interval`` of random spread; while the answer is "no producers" it waits
    ``first_retry`` seconds instead, doubling per poll up to that interval.
    ``poll_soon()`` cuts the wait short (used when a connection drops).
    """

    def __init__(
        self,
        addresses: Iterable[str],
        topic: str,
        on_update: Callable[[set[str]], None],
        *,
        interval: float = 60.0,
        jitter: float = 0.3,
        timeout: float = 5.0,
        first_retry: float = 1.0,
        rand: Callable[[], float] = random.random,
        allow: Iterable[str] = (),
    ) -> None:
        self.allow = list(allow)
        """host:port patterns; a listed nsqd matching none is ignored (none: take all)."""
        self._refused: set[str] = set()
        self.addresses = [a if "://" in a else f"http://{a}" for a in addresses]
        self.topic = topic
        self.on_update = on_update
        self.interval = interval
        self.jitter = jitter
        self.timeout = timeout
        self._rand = rand
        self._wake = asyncio.Event()
        self._client: httpx.AsyncClient | None = None
        self.first_retry = first_retry
        self.last_producers: set[str] = set()
        self.polls = 0
        self._retry = first_retry  # the next wait while there are no producers
        self._empty = False  # the last answer had no producers
        self._told_empty = False
        self.answered = 0
        """Rounds in which at least one lookupd answered."""
        self.http_addresses: dict[str, str] = {}
        """nsqd HTTP API (``http://host:port``) by TCP address, as lookupd listed them
        (the producers of the last round only)."""
        self._failing: dict[str, str] = {}  # lookupd -> the error last logged for it

    def next_wait(self) -> float:
        """Seconds until the next poll: the interval, spread by the jitter fraction; shorter
        while the topic has no producers (``first_retry``, doubling per poll)."""
        regular = self.interval * (1.0 - self.jitter / 2.0 + self.jitter * self._rand())
        if not self._empty:
            return regular
        wait = min(self._retry, regular)
        self._retry = min(self._retry * 2.0, self.interval)
        return wait

    async def poll(self) -> set[str] | None:
        """Query every lookupd once; the union of producers, or None if none answered."""
        import httpx  # here, not at import: it costs ~60 ms

        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout, headers={"Accept": "application/vnd.nsq; version=1.0"}
            )
        results = await asyncio.gather(*(self._query(a) for a in self.addresses))
        self.polls += 1
        answered = [r for r in results if r is not None]
        if not answered:
            return None
        self.answered += 1
        union: set[str] = set().union(*answered)
        if self.allow:
            union = self._allowed(union)
        self.last_producers = union
        # Only the nsqd in use: a lookupd listing ever new ones cannot grow this.
        self.http_addresses = {a: h for a, h in self.http_addresses.items() if a in union}
        self._note_empty(not union)
        self.on_update(union)
        return union

    def _allowed(self, found: set[str]) -> set[str]:
        kept = {a for a in found if matches_address(a, self.allow)}
        for address in sorted(found - kept - self._refused)[:20]:
            log.warning("lookupd lists nsqd %s, which lookupd_allowed_nsqd does not match; "
                        "ignored", address)  # fmt: skip
        self._refused |= found - kept
        return kept

    def _note_empty(self, empty: bool) -> None:
        if empty and not self._told_empty:
            self._told_empty = True
            log.info(
                "topic %s has no producers in nsqlookupd yet (nobody has published to it); "
                "polling again in %g s, doubling up to every %g s",
                self.topic,
                self.first_retry,
                self.interval,
            )
        if not empty:
            self._retry, self._told_empty = self.first_retry, False
        self._empty = empty

    async def _query(self, base: str) -> set[str] | None:
        import httpx  # here, not at import: it costs ~60 ms

        assert self._client is not None
        url = f"{base.rstrip('/')}/lookup"
        try:
            payload = await get_json(self._client, url, params={"topic": self.topic})
            producers = parse_producers(payload)
            self.http_addresses.update(http_addresses(payload))
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return set()  # TOPIC_NOT_FOUND: nobody has published it yet
            self._failed(base, f"HTTP {exc.response.status_code}", str(exc).splitlines()[0])
            return None
        except Exception as exc:  # a broken answer must not end the poller
            kind = type(exc).__name__
            text = str(exc).splitlines()[0] if str(exc) else ""
            if isinstance(exc, httpx.TimeoutException):
                text = f"no answer within {self.timeout:g} s"
            self._failed(base, kind, text or kind)
            return None
        if self._failing.pop(base, None) is not None:
            log.info("lookupd %s answers again for topic %s", base, self.topic)
        return producers

    def _failed(self, base: str, kind: str, error: str) -> None:
        """Log a lookupd's failure once, not once per poll: again only when it changes."""
        level = logging.DEBUG if self._failing.get(base) == kind else logging.WARNING
        self._failing[base] = kind
        log.log(
            level,
            "lookupd %s failed for topic %s (%s): %s; consuming from the %d nsqd known",
            base, self.topic, kind, error, len(self.last_producers),
        )  # fmt: skip

    def poll_soon(self) -> None:
        """Poll now instead of waiting for the next interval."""
        self._wake.set()

    async def run(self, poll_first: bool = True) -> None:
        """Poll forever (cancel to stop); ``poll_first=False`` waits before the first."""
        while True:
            if poll_first:
                try:
                    await self.poll()
                except Exception:  # an on_update bug: keep polling, say it loudly
                    log.exception("lookupd poll for topic %s failed; polling on", self.topic)
            poll_first = True
            try:
                await asyncio.wait_for(self._wake.wait(), self.next_wait())
            except TimeoutError:
                pass
            self._wake.clear()

    async def close(self) -> None:
        """Release the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
