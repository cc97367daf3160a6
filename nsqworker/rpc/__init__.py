"""Request/response over NSQ in the RPC seed's wire format (docs/rpc.md).

Endpoints are tasks: ``@rpc("pricing")`` serves requests published to ``pricing``.
Callers use :class:`RpcClient` (asyncio) or :class:`SyncRpcClient` (threads); an
endpoint's :class:`RpcUserError` comes back as :class:`RpcError` with its text, any
other exception as a generic ``RpcError`` with a correlation id; a missing answer as
:class:`RpcTimeout`.
"""

from nsqworker.errors import RpcDecodeError, RpcError, RpcTimeout, RpcUserError
from nsqworker.rpc.client import RpcClient
from nsqworker.rpc.endpoint import rpc
from nsqworker.rpc.sync import SyncRpcClient

__all__ = [
    "RpcClient",
    "RpcDecodeError",
    "RpcError",
    "RpcTimeout",
    "RpcUserError",
    "SyncRpcClient",
    "rpc",
]
