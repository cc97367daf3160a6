"""A blocking :class:`~nsqworker.rpc.client.RpcClient` for threads: Flask, Django, scripts."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from nsqworker.errors import ConnectionClosed
from nsqworker.rpc.client import RpcClient

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["SyncRpcClient"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class SyncRpcClient:
    """A blocking :class:`RpcClient`: same arguments, ``call()`` waits for the answer.

    Like :class:`~nsqworker.SyncProducer`, it runs its own event loop in a daemon
    thread; any number of threads may call at once (their calls share the reply
    topic). The constructor connects and subscribes, so it raises
    :class:`~nsqworker.errors.NoConnection` at once when nsqd is down. ``close()``
    (also run at interpreter exit) stops the loop. Create it after a fork, never
    before.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: list[str] | str | None = None,
        *,
        lookupd_http_addresses: list[str] | str | None = None,
        settings: Settings | None = None,
        reply_nsqd: str | None = None,
        nsqd_http_address: str | None = None,
        timeout: float = 5.0,
        encoding: int | str = "json",
        max_in_flight: int = 2500,
    ) -> None:
        self._client = RpcClient(
            nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            settings=settings,
            reply_nsqd=reply_nsqd,
            nsqd_http_address=nsqd_http_address,
            timeout=timeout,
            encoding=encoding,
            max_in_flight=max_in_flight,
        )
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="nsqworker-rpc", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)
        try:
            self._call(self._client.start())
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<SyncRpcClient {self._client!r}>"

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
    def client(self) -> RpcClient:
        """The async client underneath (it lives on this object's loop)."""
        return self._client

    def call(
        self,
        topic: str,
        value: Any,
        *,
        timeout: float | None = None,
        encoding: int | str | None = None,
    ) -> Any:
        """Call the endpoint on ``topic`` and wait for its answer; see RpcClient.call."""
        return self._call(self._client.call(topic, value, timeout=timeout, encoding=encoding))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        problem = self._unusable()
        if problem is not None:
            coro.close()
            raise problem
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while not concurrent.futures.wait([future], 1.0)[0]:
            if not self._thread.is_alive():
                future.cancel()
                raise ConnectionClosed("the RPC client was closed during the call")
        return future.result()

    def _unusable(self) -> Exception | None:
        if self._closed:
            return ConnectionClosed("the RPC client is closed")
        if threading.current_thread() is self._thread:
            return RuntimeError("SyncRpcClient called from its own event loop; use RpcClient")
        if os.getpid() != self._pid:
            return RuntimeError(
                "SyncRpcClient was created before this process forked; create it in each process"
            )
        return None

    def close(self, timeout: float = 5.0) -> None:
        """Close the client (deleting its reply topic), stop the loop. Idempotent."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncRpcClient.close() called from its own event loop")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        if os.getpid() != self._pid:
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self._client.close(timeout), self._loop)
            future.result(timeout + 5)
        except Exception as exc:
            log.debug("closing the RPC client: %s", exc)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()
