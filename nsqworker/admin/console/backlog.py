"""How far behind each task is, asked of the broker itself.

* NSQ: the channel's ``depth`` plus its ``deferred_count`` (retries waiting for their
  delay), summed over every nsqd, from nsqd's ``/stats`` (one read per nsqd per refresh).
  The nsqd come from nsqlookupd's ``/nodes``, or from ``nsqd_tcp_addresses``, whose HTTP
  port is taken as the TCP port + 1 (nsqd's defaults, 4150 and 4151).
* NATS JetStream: the durable consumer's ``num_pending`` (messages not yet delivered).
* RabbitMQ Streams: the channel's lag (messages after the offset it stored under its
  name; the whole stream before it stored one) on the topic's stream plus on its retry
  streams (retries waiting for their delay, as NSQ's deferred), from the stream
  protocol's StreamStats and QueryOffset over a connection of its own per refresh
  (:mod:`nsqworker.streams.lag`). It may count a few more than the messages left: one
  per offset store RabbitMQ wrote into the stream after the channel's own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["Backlog", "BacklogValue", "TaskKey"]

#: ``(system, topic, channel)`` of a task, as ``/status`` reports them.
TaskKey = tuple[str, str, str]


@dataclass(frozen=True)
class BacklogValue:
    """Messages waiting for a task's channel; ``None`` with ``note`` saying why not known."""

    count: int | None
    note: str = ""


class Backlog:
    """Measures the backlog of the tasks seen; one per console, reused across refreshes."""

    def __init__(self, settings: Settings, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self.http = http
        self._nats: Any = None
        self._nats_names: dict[tuple[str, str], tuple[str, str]] = {}

    async def measure(self, keys: list[TaskKey]) -> dict[TaskKey, BacklogValue]:
        """The backlog of each key; a broker that cannot be read gives a note, not an error."""
        result: dict[TaskKey, BacklogValue] = {}
        nsq = [k for k in keys if k[0] == "nsq"]
        if nsq:
            result.update(await self._nsq(nsq))
        nats = [k for k in keys if k[0] == "nats"]
        if nats:
            result.update(await self._nats_pending(nats))
        streams = [k for k in keys if k[0] == "rabbitmq"]
        if streams:
            result.update(await self._stream_lags(streams))
        for key in keys:
            result.setdefault(key, BacklogValue(None, f"not measured on {key[0]}"))
        return result

    async def close(self) -> None:
        """Close the broker connections opened for measuring."""
        if self._nats is not None:
            await self._nats.close()
            self._nats = None

    # -- NSQ ----------------------------------------------------------------------------

    async def _nsqd_http(self) -> list[str]:
        lookupds = list(self.settings.lookupd_http_addresses)
        if not lookupds:
            from nsqworker.nsq.lookupd import default_http_address

            return [default_http_address(tcp) for tcp in self.settings.nsqd_tcp_addresses]
        found: set[str] = set()
        for lookupd in lookupds:
            response = await self.http.get(f"{lookupd.rstrip('/')}/nodes")
            response.raise_for_status()
            doc = response.json()
            for node in (doc.get("data") or doc).get("producers") or ():
                host = str(node["broadcast_address"])
                host = f"[{host}]" if ":" in host else host
                found.add(f"http://{host}:{int(node['http_port'])}")
        return sorted(found)

    async def _nsq(self, keys: list[TaskKey]) -> dict[TaskKey, BacklogValue]:
        try:
            nsqds = await self._nsqd_http()
            stats = await asyncio.gather(*(self._nsqd_stats(url) for url in nsqds))
            return {
                key: BacklogValue(sum(_nsq_depth(topics, key[1], key[2]) for topics in stats))
                for key in keys
            }
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            note = f"nsqd stats unavailable: {type(exc).__name__}: {exc}"
            return {key: BacklogValue(None, note) for key in keys}

    async def _nsqd_stats(self, url: str) -> list[dict[str, Any]]:
        response = await self.http.get(
            f"{url}/stats", params={"format": "json", "include_clients": "false"}
        )
        response.raise_for_status()
        doc = response.json()
        topics: list[dict[str, Any]] = (doc.get("data") or doc).get("topics") or []
        return topics

    # -- NATS ---------------------------------------------------------------------------

    async def _nats_pending(self, keys: list[TaskKey]) -> dict[TaskKey, BacklogValue]:
        from nsqworker.errors import NSQWorkerError

        try:
            js = await self._jetstream()
        except (NSQWorkerError, OSError) as exc:
            note = f"NATS unavailable: {exc}"
            return {key: BacklogValue(None, note) for key in keys}
        answers = await asyncio.gather(
            *(self._consumer_pending(js, topic, channel) for _, topic, channel in keys),
            return_exceptions=True,
        )
        result = {}
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, BaseException):
                result[key] = BacklogValue(None, f"consumer info unavailable: {answer}")
            else:
                result[key] = BacklogValue(answer)
        return result

    async def _jetstream(self) -> Any:
        if self._nats is None:
            from nsqworker.nats.client import NatsConnection

            self._nats = NatsConnection(self.settings, name="nsqworker-console")
        client = await self._nats.get()
        return client.jetstream()

    async def _consumer_pending(self, js: Any, topic: str, channel: str) -> int:
        from nsqworker.nats.jetstream import consumer_name

        names = self._nats_names.get((topic, channel))
        if names is None:
            stream = self.settings.nats_stream or await js.find_stream_name_by_subject(topic)
            names = (stream, await consumer_name(js, stream, topic, channel))
            self._nats_names[(topic, channel)] = names
        info = await js.consumer_info(*names)
        return int(info.num_pending or 0)

    # -- RabbitMQ Streams ------------------------------------------------------------------

    async def _stream_lags(self, keys: list[TaskKey]) -> dict[TaskKey, BacklogValue]:
        from nsqworker.errors import NoConnection
        from nsqworker.streams.lag import StreamMissing, stream_lags
        from nsqworker.streams.retries import retry_streams

        streams = {(topic, channel): [topic, *retry_streams(topic, channel)]
                   for _, topic, channel in keys}  # fmt: skip
        pairs = [(stream, channel) for (_, channel), names in streams.items() for stream in names]
        try:
            lags = await stream_lags(self.settings, pairs)
        except NoConnection as exc:
            note = f"RabbitMQ Streams unavailable: {exc}"
            return {key: BacklogValue(None, note) for key in keys}
        result = {}
        for key in keys:
            topic, channel = key[1], key[2]
            total, note = 0, ""
            for i, stream in enumerate(streams[(topic, channel)]):
                lag = lags[(stream, channel)]
                if isinstance(lag, int):
                    total += lag
                elif i == 0 or not isinstance(lag, StreamMissing):  # retries: made lazily
                    note = note or f"stream lag unavailable: {lag}"
            result[key] = BacklogValue(None, note) if note else BacklogValue(total)
        return result


def _nsq_depth(topics: list[dict[str, Any]], topic: str, channel: str) -> int:
    """A channel's depth + deferred in one nsqd's stats; the topic's depth while the
    channel does not exist yet (its messages go to the first channel made)."""
    for item in topics:
        if item.get("topic_name") != topic:
            continue
        for ch in item.get("channels") or ():
            if ch.get("channel_name") == channel:
                return int(ch.get("depth") or 0) + int(ch.get("deferred_count") or 0)
        return int(item.get("depth") or 0)
    return 0
