"""Request/response over NSQ in the RPC seed's wire format (docs/rpc.md).

Endpoints are tasks: ``@rpc("pricing")`` serves requests published to ``pricing``.
Callers use :class:`RpcClient` (asyncio) or :class:`SyncRpcClient` (threads); an
endpoint's :class:`RpcUserError` comes back as :class:`RpcError` with its text, any
other exception as a generic ``RpcError`` with a correlation id; a missing answer as
:class:`RpcTimeout`.
"""

from typing import TYPE_CHECKING, Any

from nsqworker.errors import RpcDecodeError, RpcError, RpcTimeout, RpcUserError

if TYPE_CHECKING:
    from nsqworker.rpc.client import RpcClient
    from nsqworker.rpc.endpoint import rpc
    from nsqworker.rpc.sync import SyncRpcClient

# Imported on first use: a caller (`nsqworker rpc call`) does not pay for the endpoint
# side (its logging) and an endpoint not for the client's.
_LAZY = {
    "RpcClient": "nsqworker.rpc.client",
    "SyncRpcClient": "nsqworker.rpc.sync",
    "rpc": "nsqworker.rpc.endpoint",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nsqworker.rpc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "RpcClient",
    "RpcDecodeError",
    "RpcError",
    "RpcTimeout",
    "RpcUserError",
    "SyncRpcClient",
    "rpc",
]
