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
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

import httpx

__all__ = ["LookupdPoller", "format_address", "parse_producers"]

log = logging.getLogger("nsqworker.nsq.lookupd")


def format_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def parse_producers(payload: Any) -> set[str]:
    """The ``broadcast_address:tcp_port`` of each producer in a /lookup answer.

    Accepts nsqlookupd v1 answers (``{"producers": [...]}``) and the older wrapped form
    (``{"status_code": 200, "data": {"producers": [...]}}``).
    """
    if not isinstance(payload, dict):
        raise ValueError(f"lookupd answer is not a JSON object: {payload!r:.200}")
    data = payload.get("data", payload)
    if not isinstance(data, dict):
        raise ValueError(f"lookupd answer has no producers: {payload!r:.200}")
    found = set()
    for producer in data.get("producers") or []:
        host = producer.get("broadcast_address") or producer.get("address")
        port = producer.get("tcp_port")
        if host and isinstance(port, int):
            found.add(format_address(host, port))
    return found


def http_addresses(payload: Any) -> dict[str, str]:
    """``{tcp address: "http://host:http_port"}`` of the producers in a /lookup answer."""
    data = payload.get("data", payload) if isinstance(payload, dict) else None
    found: dict[str, str] = {}
    for producer in (data.get("producers") or []) if isinstance(data, dict) else []:
        host = producer.get("broadcast_address") or producer.get("address")
        tcp, http = producer.get("tcp_port"), producer.get("http_port")
        if host and isinstance(tcp, int) and isinstance(http, int):
            found[format_address(host, tcp)] = f"http://{format_address(host, http)}"
    return found


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
    ) -> None:
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
        self.http_addresses: dict[str, str] = {}
        """nsqd HTTP API (``http://host:port``) by TCP address, as lookupd listed them."""
        """Rounds in which at least one lookupd answered."""
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
        self.last_producers = union
        self._note_empty(not union)
        self.on_update(union)
        return union

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
        assert self._client is not None
        url = f"{base.rstrip('/')}/lookup"
        try:
            response = await self._client.get(url, params={"topic": self.topic})
            if response.status_code == 404:
                return set()  # TOPIC_NOT_FOUND: nobody has published it yet
            response.raise_for_status()
            payload = response.json()
            producers = parse_producers(payload)
            self.http_addresses.update(http_addresses(payload))
        except (httpx.HTTPError, ValueError) as exc:
            kind = type(exc).__name__
            if isinstance(exc, httpx.HTTPStatusError):
                kind = f"HTTP {exc.response.status_code}"
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
                await self.poll()
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
