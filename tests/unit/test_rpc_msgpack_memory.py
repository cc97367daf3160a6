"""A msgpack RPC body cannot make its decoding take many times its size (issue 29):
one byte of msgpack is an empty map, 64 bytes in Python."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack  # the msgpack extra, in the dev environment: a missing one fails
import pytest

from nsqworker.errors import RpcDecodeError
from nsqworker.rpc import codec

MIB = 2**20


def array_of(count: int, element: bytes) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big") + element * count


def peak_of(decode: Callable[[], Any]) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        decode()
        error = None
    except RpcDecodeError as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, error


@pytest.mark.parametrize(
    "element", [b"\x80", b"\x90", b"\x81\xa0\x00"], ids=["empty-maps", "empty-lists", "tiny-maps"]
)
def test_a_megabyte_of_tiny_containers_is_refused_within_a_bound(element: bytes) -> None:
    body = array_of((MIB - 5) // len(element), element)
    peak, error = peak_of(lambda: codec.decode_value(codec.MSGPACK, body))
    assert error is not None and "MiB of lists and maps" in str(error)
    assert peak < 20 * MIB, f"decoding peaked at {peak / MIB:.0f} MiB"  # 72 MiB unbounded


def test_ordinary_records_of_the_same_size_decode() -> None:
    records = [{"id": 123, "name": "abcdef", "ok": True}] * 49_000
    body = msgpack.packb(records)
    assert len(body) > MIB - 30_000
    assert codec.decode_value(codec.MSGPACK, body) == records
