"""Calling the service from Python: ``python -m examples.rpc.call`` (needs an nsqd on
127.0.0.1:4150, or NSQWORKER_NSQD_TCP_ADDRESSES, and the service running)."""

from __future__ import annotations

import asyncio

from nsqworker.rpc import RpcClient, RpcError, SyncRpcClient


async def main() -> None:
    async with RpcClient(timeout=5.0) as client:
        print(await client.call("pricing", {"sku": "A1", "quantity": 3}))
        # Many calls at once share the client's one reply topic.
        quotes = await asyncio.gather(
            *(client.call("pricing", {"sku": s}) for s in ["A1", "B2", "C3"])
        )
        print([q["total"] for q in quotes])
        try:
            await client.call("pricing", {"sku": "Z9"})
        except RpcError as exc:
            print(f"the endpoint raised {exc.type}: {exc.message}")
        # msgpack is refused by "stock" (JSON only): answered after one JSON resend.
        print(await client.call("stock", {"sku": "C3"}, encoding="msgpack"), client.fallbacks)


def blocking() -> None:
    with SyncRpcClient(timeout=5.0) as client:  # for threads: Flask, Django, scripts
        print(client.call("stock", {"sku": "A1"}))


if __name__ == "__main__":
    import os

    os.environ.setdefault("NSQWORKER_NSQD_TCP_ADDRESSES", "127.0.0.1:4150")
    asyncio.run(main())
    blocking()
