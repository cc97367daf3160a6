"""A blocking :class:`~nsqworker.rpc.client.RpcClient` for threads: Flask, Django, scripts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nsqworker.nsq.loop_thread import BlockingClient, LoopThread
from nsqworker.rpc.client import RpcClient

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["SyncRpcClient"]


class SyncRpcClient(BlockingClient):
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
        self._runner = LoopThread("SyncRpcClient", "RpcClient", "the RPC client", self.close)
        self._call = self._runner.call
        try:
            self._call(self._client.start())
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<SyncRpcClient {self._client!r}>"

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

    def close(self, timeout: float = 5.0) -> None:
        """Close the client (deleting its reply topic), stop the loop. Idempotent."""
        self._runner.close(self._client.close(timeout), timeout)
