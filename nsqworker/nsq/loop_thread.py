"""An event loop in a daemon thread that blocking code hands coroutines to: the engine
of :class:`~nsqworker.SyncProducer` and :class:`~nsqworker.rpc.SyncRpcClient`."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

from nsqworker.errors import ConnectionClosed

__all__ = ["BlockingClient", "LoopThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class BlockingClient:
    """``with`` for the blocking clients built on a :class:`LoopThread`: the block's end
    runs ``close()``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LoopThread:
    """Runs ``loop.run_forever`` in a daemon thread until :meth:`close`.

    ``owner`` names the blocking class in errors ("SyncProducer"), ``async_name`` the
    async class to use instead from a loop ("Producer"), ``what`` the object in
    sentences ("the producer"). ``close_owner``, the owner's ``close()``, is registered
    to run at interpreter exit until :meth:`close` runs.
    """

    def __init__(
        self, owner: str, async_name: str, what: str, close_owner: Callable[[], None]
    ) -> None:
        self.owner, self.async_name, self.what = owner, async_name, what
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._lock = threading.Lock()
        self._close_owner = close_owner
        self.thread = threading.Thread(
            target=self.loop.run_forever, name=f"nsqworker-{async_name.lower()}", daemon=True
        )
        self.thread.start()
        atexit.register(close_owner)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait; the coroutine enforces the timeouts."""
        problem = self.unusable()
        if problem is not None:
            coro.close()
            raise problem
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while not concurrent.futures.wait([future], 1.0)[0]:
            if not self.thread.is_alive():  # closed meanwhile: the loop is gone
                future.cancel()
                raise ConnectionClosed(f"{self.what} was closed during the call")
        return future.result()

    def unusable(self) -> Exception | None:
        """Why a call cannot be made from here and now, or None."""
        if self.closed:
            return ConnectionClosed(f"{self.what} is closed")
        if threading.current_thread() is self.thread:
            return RuntimeError(
                f"{self.owner} called from its own event loop; use {self.async_name}"
            )
        if os.getpid() != self.pid:
            return RuntimeError(
                f"{self.owner} was created before this process forked and its thread did not "
                "follow; create it in each process (e.g. after the server's fork)"
            )
        return None

    def close(self, closing: Coroutine[Any, Any, Any], timeout: float) -> None:
        """Run ``closing`` on the loop, stop it and join its thread. Idempotent."""
        if threading.current_thread() is self.thread:
            closing.close()
            raise RuntimeError(f"{self.owner}.close() called from its own event loop")
        with self._lock:
            already, self.closed = self.closed, True
        if already or os.getpid() != self.pid:  # a forked copy: the loop's thread is not here
            closing.close()
            return
        atexit.unregister(self._close_owner)
        try:
            asyncio.run_coroutine_threadsafe(closing, self.loop).result(timeout + 5)
        except Exception as exc:
            log.debug("closing %s: %s", self.what, exc)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
            if not self.thread.is_alive():
                self.loop.close()
