"""A blocking :class:`~nsqworker.nsq.producer.Producer` for threads: Flask, Django, scripts."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from nsqworker.errors import ConnectionClosed
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.producer import Body, Producer

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["SyncProducer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class SyncProducer:
    """A blocking :class:`Producer` for threads: Flask, Django, scripts.

    It runs its own event loop in a daemon thread, started here; the methods hand
    coroutines to that loop and wait for them, so any number of threads may call them
    at once (their publishes are pipelined together). ``close()`` stops the loop; it
    also runs at interpreter exit if forgotten. Same arguments and semantics
    (at-least-once, failover) as :class:`Producer`. Never call it from its own loop.
    Under a pre-forking server (gunicorn ``--preload``) create it in each worker: a
    thread does not survive ``fork()``.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: list[str] | str | None = None,
        *,
        settings: Settings | None = None,
        connection_config: ConnectionConfig | None = None,
        timeout: float = 5.0,
        envelope: bool | None = None,
        max_message_size: int | None = None,
        max_body_size: int | None = None,
    ) -> None:
        self._producer = Producer(
            nsqd_tcp_addresses,
            settings=settings,
            connection_config=connection_config,
            timeout=timeout,
            envelope=envelope,
            max_message_size=max_message_size,
            max_body_size=max_body_size,
        )
        self.timeout = timeout
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="nsqworker-producer", daemon=True
        )
        self._thread.start()
        self._loop.call_soon_threadsafe(self._producer._start)
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"<SyncProducer {self._producer!r}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def producer(self) -> Producer:
        """The async producer underneath (it lives on this object's loop)."""
        return self._producer

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait; the coroutine enforces the timeouts."""
        problem = self._unusable()
        if problem is not None:
            coro.close()
            raise problem
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while not concurrent.futures.wait([future], 1.0)[0]:
            if not self._thread.is_alive():  # closed meanwhile: the loop is gone
                future.cancel()
                raise ConnectionClosed("the producer was closed during the call")
        return future.result()

    def _unusable(self) -> Exception | None:
        if self._closed:
            return ConnectionClosed("the producer is closed")
        if threading.current_thread() is self._thread:
            return RuntimeError("SyncProducer called from its own event loop; use Producer")
        if os.getpid() != self._pid:
            return RuntimeError(
                "SyncProducer was created before this process forked and its thread did not "
                "follow; create it in each process (e.g. after the server's fork)"
            )
        return None

    def connect(self, timeout: float | None = None) -> None:
        """Wait until one nsqd is connected (optional: publishes connect on demand)."""
        self._call(self._producer.connect(timeout))

    def publish(
        self, topic: str, body: Body, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish one message (DPUB when ``delay`` seconds are given); see Producer."""
        self._call(self._producer.publish(topic, body, delay, timeout))

    def publish_json(
        self, topic: str, obj: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish ``obj`` as compact JSON; see :meth:`Producer.publish_json`."""
        self._call(self._producer.publish_json(topic, obj, delay, timeout))

    def publish_many(
        self, topic: str, bodies: Iterable[Body], timeout: float | None = None
    ) -> None:
        """Publish with MPUB, split when too big (then not atomic); see Producer."""
        self._call(self._producer.publish_many(topic, list(bodies), timeout))

    def close(self, timeout: float = 5.0) -> None:
        """Close the connections, stop the loop and join its thread. Idempotent."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncProducer.close() called from its own event loop")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        if os.getpid() != self._pid:  # a forked copy: the loop's thread is not here
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self._producer.close(timeout), self._loop)
            future.result(timeout + 5)
        except Exception as exc:
            log.debug("closing the producer: %s", exc)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()
