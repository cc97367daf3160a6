"""RPC on NATS, the caller's side: :class:`NatsCaller`, what :class:`~nsqworker.rpc.RpcClient`
uses on ``transport="nats"``.

NATS has request/reply built in: a request carries a reply subject that NATS routes
back to the caller, so there is no RPC frame and no reply address. The body is the
value itself, in the encoding its ``Content-Type`` header names
(:data:`~nsqworker.rpc.codec.CONTENT_TYPES`); an endpoint answers in the same encoding,
or with the ``{"error": {"type", "message"}}`` value and the NATS service error
headers (the endpoint's side: ``_Endpoint.serve_nats``; docs/rpc.md, "RPC on NATS").
Any NATS client is a caller: ``nats req pricing '{"sku": 7}'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nsqworker.errors import RpcDecodeError, RpcError, RpcTimeout
from nsqworker.rpc import codec

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["NatsCaller"]


class NatsCaller:
    """What :class:`~nsqworker.rpc.RpcClient` uses on ``transport="nats"``: NATS
    requests on one connection of ``settings`` (``nats_servers``, credentials, TLS)."""

    def __init__(self, settings: Settings) -> None:
        from nsqworker.nats.client import NatsConnection

        self.connection = NatsConnection(settings, name=f"nsqworker-rpc {settings.client_id}")

    async def start(self) -> None:
        """Connect (NoConnection when no server answers, ConfigurationError if refused)."""
        await self.connection.get()

    async def close(self) -> None:
        """Close the connection."""
        await self.connection.close()

    async def call(self, topic: str, value: Any, timeout: float, encoding: int) -> Any:
        """One request: the response's value; RpcError, RpcTimeout as on NSQ."""
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        from nsqworker.nats.jetstream import check_subject

        body = codec.encode_value(encoding, value)
        client = await self.connection.get()
        headers = {"Content-Type": codec.CONTENT_TYPES[encoding]}
        try:
            reply = await client.request(
                check_subject(topic), body, timeout=timeout, headers=headers
            )
        except NoRespondersError:
            raise RpcError("NoResponders", f"no endpoint serves {topic!r} on NATS", topic) from None
        except (NatsTimeout, TimeoutError):
            raise RpcTimeout(f"no response from {topic!r} within {timeout:g}s") from None
        answer = codec.encoding_of_content_type(reply.headers)
        if answer is None:
            raise RpcDecodeError(f"response from {topic!r} in an unknown encoding")
        result = codec.decode_value(answer, reply.data)
        if answer != codec.BINARY and codec.is_error_value(result):
            error = result["error"]
            raise RpcError(error["type"], str(error.get("message", "")), topic)
        return result
