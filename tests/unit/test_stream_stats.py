"""The StreamStats codec byte by byte (nsqworker.streams.stats), hostile answers included,
and the lag's arithmetic."""

from __future__ import annotations

import struct

import pytest

from nsqworker.streams.lag import lag_of
from nsqworker.streams.stats import (
    OFFSET_TYPE_LAST,
    OFFSET_TYPE_OFFSET,
    Frame,
    FrameBuffer,
    StatsProtocolError,
    decode_deliver_header,
    decode_query_offset,
    decode_response,
    decode_stream_stats,
    encode_query_offset,
    encode_sasl_authenticate,
    encode_stream_stats,
    encode_subscribe,
)


def stats_response(correlation_id: int, code: int, stats: dict[str, int]) -> bytes:
    """A StreamStats response frame as RabbitMQ writes it."""
    body = struct.pack(">HHIHi", 0x801C, 1, correlation_id, code, len(stats))
    for name, value in stats.items():
        body += struct.pack(">h", len(name)) + name.encode() + struct.pack(">q", value)
    return struct.pack(">I", len(body)) + body


def test_the_request_is_key_28_with_the_stream_name() -> None:
    assert encode_stream_stats(7, "orders") == (
        b"\x00\x00\x00\x10"  # size: 2 + 2 + 4 + 2 + 6
        b"\x00\x1c\x00\x01"  # key 28, version 1
        b"\x00\x00\x00\x07"  # correlation id
        b"\x00\x06orders"
    )


def test_a_response_split_anywhere_decodes_to_the_statistics() -> None:
    stats = {"first_chunk_id": 0, "committed_chunk_id": 4096, "last_chunk_id": 5000}
    data = stats_response(9, 1, stats) + stats_response(10, 2, {})
    for cut in range(len(data)):
        buffer = FrameBuffer()
        frames = buffer.feed(data[:cut]) + buffer.feed(data[cut:])
        assert len(frames) == 2
        answer = decode_response(frames[0])
        assert (answer.key, answer.correlation_id, answer.code) == (28, 9, 1)
        assert decode_stream_stats(answer.rest) == stats
        missing = decode_response(frames[1])
        assert (missing.code, missing.reason) == (2, "stream does not exist")


def test_an_empty_stream_answers_minus_one() -> None:
    frame = FrameBuffer().feed(stats_response(1, 1, {"committed_chunk_id": -1}))[0]
    assert decode_stream_stats(decode_response(frame).rest) == {"committed_chunk_id": -1}


@pytest.mark.parametrize(
    "rest",
    [
        b"",  # no count
        b"\x00\x00",  # half a count
        struct.pack(">i", 1),  # one statistic announced, none there
        struct.pack(">i", -1),
        struct.pack(">i", 2**31 - 1) + b"\x00" * 20,  # a count no frame can hold
        struct.pack(">ih", 1, 50) + b"abc",  # a name running past the end
        struct.pack(">ih", 1, 1) + b"a" + b"\x00" * 4,  # a value cut short
        struct.pack(">ih", 1, 2) + b"\xff\xfe" + b"\x00" * 8,  # a name not UTF-8
    ],
    ids=[
        "empty",
        "half-count",
        "missing",
        "negative",
        "huge",
        "long-name",
        "short-value",
        "not-utf8",
    ],
)
def test_a_hostile_statistics_list_is_a_protocol_error(rest: bytes) -> None:
    with pytest.raises(StatsProtocolError, match="StreamStats response"):
        decode_stream_stats(rest)


def test_short_and_oversized_frames_are_protocol_errors() -> None:
    with pytest.raises(StatsProtocolError, match="too short"):
        decode_response(Frame(0x801C, 1, b"\x00\x00\x00\x01\x00"))  # code cut short
    with pytest.raises(StatsProtocolError, match="not a response"):
        decode_response(Frame(0x001C, 1, b"\x00" * 6))
    with pytest.raises(StatsProtocolError, match="limit"):
        FrameBuffer(max_frame=1024).feed(struct.pack(">I", 1025))
    with pytest.raises(StatsProtocolError, match="frame of 2 bytes"):
        FrameBuffer().feed(struct.pack(">IH", 2, 0))
    with pytest.raises(StatsProtocolError, match="QueryOffset"):
        decode_query_offset(b"\x00\x00\x00")
    assert decode_query_offset(struct.pack(">Q", 41)) == 41


def test_query_offset_and_subscribe_requests() -> None:
    assert encode_query_offset(3, "billing", "orders") == (
        struct.pack(">IHHI", 25, 11, 1, 3) + b"\x00\x07billing\x00\x06orders"
    )
    # first/next/last carry no offset; an absolute offset does
    assert encode_subscribe(4, 0, "s", OFFSET_TYPE_LAST, 0, 1) == (
        struct.pack(">IHHIB", 20, 7, 1, 4, 0) + b"\x00\x01s" + struct.pack(">HHi", 2, 1, 0)
    )
    assert encode_subscribe(4, 0, "s", OFFSET_TYPE_OFFSET, 300, 1)[-16:] == struct.pack(
        ">HQHi", 4, 300, 1, 0
    )


def test_plain_authentication_carries_user_and_password() -> None:
    frame = encode_sasl_authenticate(2, "user", "pw")
    assert frame[4:12] == struct.pack(">HHI", 19, 1, 2)
    assert frame[12:] == b"\x00\x05PLAIN" + struct.pack(">i", 8) + b"\x00user\x00pw"


def chunk_header(first_offset: int, records: int, magic: int = 0x50) -> bytes:
    return struct.pack(">BbHIqQQ", magic, 0, records, records, 0, 1, first_offset) + b"\x00" * 16


def test_the_deliver_header_gives_the_chunk_range() -> None:
    v1 = Frame(8, 1, b"\x00" + chunk_header(4000, 96))
    assert decode_deliver_header(v1) == (0, 4000, 96)
    v2 = Frame(8, 2, b"\x03" + struct.pack(">Q", 4095) + chunk_header(4000, 96))
    assert decode_deliver_header(v2) == (3, 4000, 96)
    with pytest.raises(StatsProtocolError, match="magic"):
        decode_deliver_header(Frame(8, 1, b"\x00" + chunk_header(0, 1, magic=0x10)))
    with pytest.raises(StatsProtocolError, match="too short"):
        decode_deliver_header(Frame(8, 1, b"\x00" + chunk_header(0, 1)[:20]))


@pytest.mark.parametrize(
    ("first", "end", "stored", "lag"),
    [
        (0, 20, None, 20),  # nothing stored: the whole stream
        (0, 20, 6, 13),  # 0..6 handled
        (0, 20, 19, 0),
        (100, 120, None, 20),  # retention removed 0..99
        (100, 120, 40, 20),  # the stored offset is older than what is retained
        (0, 20, 25, 0),  # never below zero
    ],
)
def test_lag_arithmetic(first: int, end: int, stored: int | None, lag: int) -> None:
    assert lag_of(first, end, stored) == lag
