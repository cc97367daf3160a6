"""The RabbitMQ source's chunk decoding without a broker: the Arrow fast path for chunks
of plain messages gives exactly what the record-by-record path gives, and falls back to
it for anything else (sub-batches, properties, a lying length), never a wrong body."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqworker.spark.streaming.chunks import ChunkError, decode_chunk
from nsqworker.spark.streaming.columns import Rows
from nsqworker.streams import amqp

HEADER = struct.Struct(">BbHIqQQiIIB3x")


def data_message(body: bytes) -> bytes:
    if len(body) < 256:
        return b"\x00Su\xa0" + bytes((len(body),)) + body
    return b"\x00Su\xb0" + struct.pack(">I", len(body)) + body


def with_properties(body: bytes) -> bytes:
    # application-properties {"a": "b"}, then the data section (as rstream encodes it)
    return b"\x00St\xc1\x07\x02\xa1\x01a\xa1\x01b" + data_message(body)


def entry(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def sub_batch(records: list[bytes], codec: int = 0) -> bytes:
    plain = b"".join(entry(r) for r in records)
    data = gzip.compress(plain) if codec == 1 else plain
    return (
        bytes((0x80 | codec << 4,))
        + struct.pack(">HII", len(records), len(plain), len(data))
        + data
    )


def payload(data: bytes, entries: int, records: int, first: int = 100) -> bytes:
    """A Deliver frame's payload: subscription id, chunk header, data."""
    crc = zlib.crc32(data)
    header = HEADER.pack(
        0x50, 0, entries, records, 1_700_000_000_000, 1, first,
        crc - (1 << 32) if crc >= 1 << 31 else crc, len(data), 0, 0,
    )  # fmt: skip
    return b"\x02" + header + data


def plain_chunk(bodies: list[bytes], first: int = 100) -> bytes:
    return payload(
        b"".join(entry(data_message(b)) for b in bodies), len(bodies), len(bodies), first
    )


def test_plain_messages_come_out_as_one_arrow_array() -> None:
    bodies = [b"", b"a", b"x" * 255, b"y" * 256, b"z" * 70_000, b'{"user": "u001"}']
    chunk = decode_chunk(plain_chunk(bodies))
    assert (chunk.first_offset, chunk.count) == (100, len(bodies))
    array = chunk.plain_bodies()
    assert array is not None and array.to_pylist() == bodies
    assert [amqp.decode(r) for r in chunk.records] == bodies  # the record path agrees


@pytest.mark.parametrize(
    "records",
    [
        [data_message(b"a"), with_properties(b"b")],  # properties: headers to read
        [data_message(b"a"), b"\x00Su\xa0\x05abc"],  # a length byte that lies
        [data_message(b"a"), b"\x00Su"],  # shorter than a data section
        [data_message(b"a"), b"\x00Sw\xa1\x03abc"],  # an AMQP value, not data
        [data_message(b"a") + data_message(b"b")],  # two data sections
        [b"\x00Su\xb0\x00\x00\x00\x09abc"],  # a vbin32 length that lies
    ],
)
def test_anything_but_plain_messages_takes_the_record_path(records: list[bytes]) -> None:
    chunk = decode_chunk(payload(b"".join(entry(r) for r in records), len(records), len(records)))
    assert chunk.plain_bodies() is None
    assert chunk.records == records


def test_sub_batches_take_the_record_path() -> None:
    inner = [data_message(b"n1"), data_message(b"n2")]
    for codec in (0, 1):
        data = entry(data_message(b"p1")) + sub_batch(inner, codec) + entry(data_message(b"p2"))
        chunk = decode_chunk(payload(data, 3, 4))
        assert chunk.plain_bodies() is None
        assert [amqp.decode(r) for r in chunk.records] == [b"p1", b"n1", b"n2", b"p2"]


def test_a_broken_chunk_is_a_clear_error() -> None:
    good = plain_chunk([b"a", b"b"])
    with pytest.raises(ChunkError, match="CRC mismatch"):
        decode_chunk(good[:-1] + b"X")
    with pytest.raises(ChunkError, match="shorter than a chunk header"):
        decode_chunk(good[:20])
    data = entry(data_message(b"a")) + entry(data_message(b"b"))
    lying = decode_chunk(payload(data, 2, 3))  # the header counts three records
    assert lying.plain_bodies() is None
    with pytest.raises(ChunkError, match="2 records, its header says 3"):
        lying.records  # noqa: B018
    cut = decode_chunk(payload(data[:-1], 2, 2))  # the last entry runs past the data
    assert cut.plain_bodies() is None
    with pytest.raises(ChunkError, match="runs past its data"):
        cut.records  # noqa: B018


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=300), st.sampled_from(["plain", "properties", "broken"])),
        min_size=1,
        max_size=30,
    )
)
def test_fast_path_agrees_with_the_record_path(items: list[tuple[bytes, str]]) -> None:
    encode = {"plain": data_message, "properties": with_properties, "broken": lambda b: b}
    records = [encode[kind](body) for body, kind in items]
    chunk = decode_chunk(payload(b"".join(entry(r) for r in records), len(records), len(records)))
    array = chunk.plain_bodies()
    decoded = [amqp.decode(r) for r in chunk.records]
    if array is not None:
        assert array.to_pylist() == decoded
    else:
        assert not all(type(d) is bytes for d in decoded) or any(
            kind != "plain" for _, kind in items
        )


def test_rows_keep_the_order_of_arrays_and_rows() -> None:
    import pyarrow as pa

    rows = Rows("clicks")
    rows.add_bodies(pa.array([b"a", b"b"], pa.binary()), 10, 1_000_000)
    rows.add(b"c", 12, "12", 2_000_000, attempts=3, headers={"k": "v"})
    rows.add_bodies(pa.array([b"d"], pa.binary()), 20, 3_000_000)
    assert len(rows) == 4 and rows.body_bytes == 4
    batch = rows.batch()
    assert len(rows) == 0
    got = batch.to_pylist()
    assert [r["body"] for r in got] == [b"a", b"b", b"c", b"d"]
    assert [r["offset"] for r in got] == [10, 11, 12, 20]
    assert [r["id"] for r in got] == ["10", "11", "12", "20"]
    assert [r["attempts"] for r in got] == [1, 1, 3, 1]
    assert [r["headers"] for r in got] == [[], [], [("k", "v")], []]
    assert {r["topic"] for r in got} == {"clicks"} and {r["key"] for r in got} == {None}
    assert [r["timestamp"].timestamp() for r in got] == [1.0, 1.0, 2.0, 3.0]
