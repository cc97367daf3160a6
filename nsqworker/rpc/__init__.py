"""Request/response over NSQ in the RPC seed's wire format (docs/rpc.md).

Endpoints are tasks: ``@rpc("pricing")`` serves requests published to ``pricing``.
Callers use :class:`RpcClient` (asyncio) or :class:`SyncRpcClient` (threads).
"""

from nsqworker.errors import RpcDecodeError, RpcError, RpcTimeout

__all__ = ["RpcDecodeError", "RpcError", "RpcTimeout"]
