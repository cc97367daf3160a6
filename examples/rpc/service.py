"""An RPC service: prices and stock levels, answered over NSQ.

Run it with ``nsqworker run examples.rpc.service`` (from the repository root) and call
it with ``nsqworker rpc call pricing '{"sku": "A1"}'``; see README.md here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nsqworker.rpc import RpcUserError, rpc

PRICES = {"A1": 12.5, "B2": 7.0, "C3": 99.99}
STOCK = {"A1": 4, "B2": 0, "C3": 17}


class UnknownSku(RpcUserError):
    """The caller asked for a sku we do not sell (its text is meant for the caller)."""


@rpc("pricing", max_in_flight=200)
async def quote(request: dict[str, Any]) -> dict[str, Any]:
    """``{"sku": "A1", "quantity": 2}`` -> ``{"sku", "quantity", "unit_price", "total"}``."""
    sku = request["sku"]
    if sku not in PRICES:
        raise UnknownSku(f"unknown sku {sku!r}")  # comes back to the caller as RpcError
    quantity = int(request.get("quantity", 1))
    await asyncio.sleep(0)  # a stand-in for a lookup in a database
    unit = PRICES[sku]
    return {"sku": sku, "quantity": quantity, "unit_price": unit, "total": unit * quantity}


@rpc("stock", encodings=["json"])
def in_stock(request: dict[str, Any]) -> dict[str, Any]:
    """A plain function runs in a thread; this endpoint only speaks JSON, so a msgpack
    caller gets the 255 reply and its client resends the call as JSON."""
    return {"sku": request["sku"], "available": STOCK.get(request["sku"], 0)}
