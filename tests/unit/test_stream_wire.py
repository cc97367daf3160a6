"""The stream protocol's consumer codec (nsqworker.streams.wire), byte by byte: frames
split anywhere, chunks with plain records and sub-entry batches, and everything a broken
or hostile peer could send (sizes over the limit, a bad CRC, records that run past their
chunk, an unknown codec) read as a clear error or as unreadable records in place, never
an exception from inside the codec and never a record lost."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqworker.errors import RemoteProtocolError
from nsqworker.streams import stats, wire
from nsqworker.streams.amqp import Decoded


def entry(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def sub_batch(records: list[bytes], codec: int = 0) -> bytes:
    plain = b"".join(entry(r) for r in records)
    data = gzip.compress(plain) if codec == 1 else plain
    head = bytes((0x80 | codec << 4,)) + struct.pack(">HII", len(records), len(plain), len(data))
    return head + data


def deliver(
    data: bytes, entries: int, records: int, *, first: int = 100, crc: int | None = None,
    magic: int = 0x50, trailer: bytes = b"", sub: int = 2, chunk_type: int = 0,
) -> bytes:  # fmt: skip
    """A Deliver frame (without its size) as RabbitMQ 4.0 sends it."""
    crc = zlib.crc32(data) if crc is None else crc
    header = struct.pack(
        ">HHBbbHIqQQiIII", wire.DELIVER, 1, sub, magic - 256 if magic > 127 else magic,
        chunk_type, entries, records, 1_700_000_000_000, 1, first,
        crc - (1 << 32) if crc >= 1 << 31 else crc, len(data), len(trailer), 0,
    )  # fmt: skip
    return header + data + trailer


def framed(frame: bytes) -> bytes:
    return struct.pack(">I", len(frame)) + frame


def test_plain_records_with_their_offsets_and_time() -> None:
    records = [b"a", b"", b"x" * 300]
    chunk = wire.parse_chunk(deliver(b"".join(map(entry, records)), 3, 3, trailer=b"tt"))
    assert chunk == wire.Chunk(2, 1_700_000_000_000, 100, records)


def test_sub_entry_batches_uncompressed_and_gzip_between_plain_records() -> None:
    data = entry(b"p1") + sub_batch([b"n1", b"n2"]) + sub_batch([b"g1", b"g2", b"g3"], 1)
    chunk = wire.parse_chunk(deliver(data + entry(b"p2"), 4, 7))
    assert chunk.records == [b"p1", b"n1", b"n2", b"g1", b"g2", b"g3", b"p2"]


def test_a_codec_we_lack_gives_one_unreadable_record_per_message_in_place() -> None:
    lz4 = bytes((0x80 | 3 << 4,)) + struct.pack(">HII", 2, 10, 3) + b"zzz"
    chunk = wire.parse_chunk(deliver(entry(b"a") + lz4 + entry(b"b"), 3, 4))
    assert chunk.records[0] == b"a" and chunk.records[3] == b"b"
    for bad in chunk.records[1:3]:
        assert isinstance(bad, Decoded) and "lz4" in (bad.error or "")


def test_a_corrupt_gzip_batch_is_unreadable_not_an_exception() -> None:
    bad = bytes((0x80 | 1 << 4,)) + struct.pack(">HII", 2, 10, 4) + b"nope"
    records = wire.parse_chunk(deliver(bad, 1, 2)).records
    assert len(records) == 2 and all(isinstance(r, Decoded) for r in records)


def test_a_crc_that_does_not_match_makes_every_record_unreadable() -> None:
    data = entry(b"a") + entry(b"b")
    chunk = wire.parse_chunk(deliver(data, 2, 2, crc=zlib.crc32(data) ^ 1))
    assert [r.error for r in chunk.records] == ["chunk at offset 100 fails its CRC-32 check"] * 2  # type: ignore[union-attr]
    assert wire.parse_chunk(deliver(data, 2, 2, crc=0), check_crc=False).records == [b"a", b"b"]


def test_a_record_running_past_its_chunk_and_a_short_count_keep_the_count() -> None:
    data = entry(b"ok") + struct.pack(">I", 999) + b"short"
    records = wire.parse_chunk(deliver(data, 2, 2)).records
    assert records[0] == b"ok" and isinstance(records[1], Decoded)
    records = wire.parse_chunk(deliver(entry(b"one"), 1, 3)).records
    assert records[0] == b"one" and len(records) == 3
    assert all("its header says 3" in (r.error or "") for r in records[1:])  # type: ignore[union-attr]


def test_data_shorter_than_its_header_says_is_unreadable_in_place() -> None:
    frame = deliver(entry(b"a") + entry(b"b"), 2, 2)
    records = wire.parse_chunk(frame[:-3]).records
    assert len(records) == 2 and all(isinstance(r, Decoded) for r in records)


def test_not_a_chunk_is_a_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError, match="too short"):
        wire.parse_chunk(deliver(b"", 0, 0)[:20])
    with pytest.raises(RemoteProtocolError, match="magic"):
        wire.parse_chunk(deliver(entry(b"a"), 1, 1, magic=0x70))


def test_a_tracking_chunk_has_no_records() -> None:
    assert wire.parse_chunk(deliver(entry(b"t"), 1, 1, chunk_type=1)).records == []


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    frames = [deliver(entry(b"m%d" % i), 1, 1, first=i) for i in range(5)]
    stream = b"".join(map(framed, frames))
    for step in (1, 3, 7, 64, len(stream)):
        reader, out = wire.FrameReader(), []
        for at in range(0, len(stream), step):
            out += reader.feed(stream[at : at + step])
        assert out == frames and reader.buffered == 0


def test_a_frame_size_over_the_limit_or_under_a_header_is_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="4 to 1000 bytes"):
        wire.FrameReader(limit=1000).feed(struct.pack(">I", 1001))
    with pytest.raises(RemoteProtocolError):
        wire.FrameReader().feed(struct.pack(">I", 2) + b"xx")
    assert wire.FrameReader().feed(struct.pack(">I", 0xFFFF_FFFF)[:3]) == []


@given(st.binary(max_size=200))
def test_garbage_after_a_valid_header_never_raises_anything_but_protocol_errors(
    data: bytes,
) -> None:
    frame = deliver(data, 3, 5)
    try:
        chunk = wire.parse_chunk(frame)
    except RemoteProtocolError:
        return
    assert len(chunk.records) == 5


@given(st.binary(max_size=120))
def test_any_bytes_are_frames_or_a_protocol_error(data: bytes) -> None:
    reader = wire.FrameReader(limit=4096)
    try:
        for frame in reader.feed(data):
            if wire.frame_key(frame) == wire.DELIVER:
                wire.parse_chunk(frame)
            elif len(frame) >= 10:
                wire.parse_response(frame)
    except RemoteProtocolError:
        pass


def test_commands_are_the_bytes_the_protocol_names() -> None:
    sub = wire.subscribe(7, 1, "s", wire.OFFSET, 42, 3, {"name": "c"})
    assert sub == framed(
        struct.pack(">HHIB", 7, 1, 7, 1) + b"\x00\x01s" + struct.pack(">HQH", 4, 42, 3)
        + struct.pack(">I", 1) + b"\x00\x04name\x00\x01c"
    )  # fmt: skip
    first = wire.subscribe(1, 0, "s", wire.FIRST, 0, 3, {})  # FIRST carries no offset
    assert first.endswith(b"\x00\x01s" + struct.pack(">HHI", 1, 3, 0))
    assert wire.store_offset("c", "s", 9) == framed(
        struct.pack(">HH", 10, 1) + b"\x00\x01c\x00\x01s" + struct.pack(">Q", 9)
    )
    assert wire.consumer_update_answer(5, wire.OFFSET, 10) == framed(
        struct.pack(">HHIHHQ", 0x801A, 1, 5, 1, 4, 10)
    )
    assert wire.close_ok(3) == framed(struct.pack(">HHIH", 0x8016, 1, 3, 1))
    assert wire.heartbeat() == framed(struct.pack(">HH", 23, 1))
    assert stats.encode_credit(2, 1) == framed(struct.pack(">HHBH", 9, 1, 2, 1))


def test_answers_from_the_server_are_read() -> None:
    update = struct.pack(">HHIBB", 26, 1, 77, 3, 1)
    assert wire.parse_consumer_update(update) == (77, 3, True)
    assert wire.parse_metadata_update(struct.pack(">HHHH", 16, 1, 6, 2) + b"ab") == "ab"
    assert wire.parse_tune(struct.pack(">HHII", 20, 1, 1048576, 60)) == (1048576, 60)
    assert wire.parse_offset(struct.pack(">HHIHQ", 0x800B, 1, 4, 1, 12345)) == 12345
    mechanisms = struct.pack(">HHIHI", 0x8012, 1, 2, 1, 2) + b"\x00\x05PLAIN\x00\x08AMQPLAIN"
    assert wire.parse_sasl_mechanisms(mechanisms) == ["PLAIN", "AMQPLAIN"]
    metadata = (
        struct.pack(">HHI", 0x800F, 1, 9) + struct.pack(">I", 2)
        + struct.pack(">H", 0) + b"\x00\x01a" + struct.pack(">I", 5552)
        + struct.pack(">H", 1) + b"\x00\x01b" + struct.pack(">I", 5553)
        + struct.pack(">I", 2)
        + b"\x00\x02s1" + struct.pack(">HHI", 1, 0, 1) + struct.pack(">H", 1)
        + b"\x00\x02s2" + struct.pack(">HHI", 6, 0, 0)
    )  # fmt: skip
    assert wire.parse_metadata(metadata) == {
        "s1": (1, [("b", 5553), ("a", 5552)]),
        "s2": (6, [("a", 5552)]),
    }
    with pytest.raises(RemoteProtocolError):
        wire.parse_metadata(metadata[:-3])
    for short in (wire.parse_consumer_update, wire.parse_tune, wire.parse_offset):
        with pytest.raises(RemoteProtocolError):
            short(b"\x00\x1a\x00\x01")
