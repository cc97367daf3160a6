"""nsqworker.nsq.protocol at the byte level: encoders, validation, the frame decoder."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqworker.errors import (
    InvalidName,
    LocalProtocolError,
    MessageTooLarge,
    NSQDError,
    RemoteProtocolError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.protocol import Decoder, ErrorFrame, Frame, MessageFrame, Response, encode_frame

MSG_ID = b"0a1b2c3d4e5f6789"


def size(n: int) -> bytes:
    return struct.pack(">I", n)


def raw_frame(frame_type: int, payload: bytes) -> bytes:
    return struct.pack(">iI", len(payload) + 4, frame_type) + payload


def typed(frames: list[Frame]) -> list[tuple[str, Frame]]:
    # NamedTuples compare as plain tuples, so Response(b"x") == ErrorFrame(b"x").
    return [(type(f).__name__, f) for f in frames]


# --- encoders ------------------------------------------------------------------------


def test_constants() -> None:
    assert protocol.MAGIC_V2 == b"  V2"
    assert protocol.HEARTBEAT == b"_heartbeat_"


def test_identify() -> None:
    assert protocol.identify({"a": 1}) == b'IDENTIFY\n\x00\x00\x00\x07{"a":1}'


@pytest.mark.parametrize("secret", ["s3cret", b"s3cret"])
def test_auth(secret: str | bytes) -> None:
    assert protocol.auth(secret) == b"AUTH\n\x00\x00\x00\x06s3cret"


def test_sub() -> None:
    assert protocol.sub("t", "c") == b"SUB t c\n"
    assert protocol.sub("clicks.v1", "archive#ephemeral") == b"SUB clicks.v1 archive#ephemeral\n"


def test_pub() -> None:
    assert protocol.pub("t", b"hello") == b"PUB t\n\x00\x00\x00\x05hello"
    assert protocol.pub("t", bytearray(b"x")) == b"PUB t\n\x00\x00\x00\x01x"
    assert protocol.pub("t", memoryview(b"xy"), max_size=2) == b"PUB t\n\x00\x00\x00\x02xy"


def test_dpub() -> None:
    assert protocol.dpub("t", 1500, b"hi") == b"DPUB t 1500\n\x00\x00\x00\x02hi"
    assert protocol.dpub("t", 0, b"hi") == b"DPUB t 0\n\x00\x00\x00\x02hi"
    assert protocol.dpub("t", 3_600_000, b"hi").startswith(b"DPUB t 3600000\n")


def test_mpub_framing() -> None:
    # body size = 4 (count) + (4 + 1) + (4 + 2) = 15
    expected = b"MPUB t\n" + size(15) + size(2) + size(1) + b"a" + size(2) + b"bc"
    assert protocol.mpub("t", [b"a", b"bc"]) == expected
    assert protocol.mpub_size([b"a", b"bc"]) == 15


def test_mpub_limits() -> None:
    with pytest.raises(LocalProtocolError, match="at least one"):
        protocol.mpub("t", [])
    with pytest.raises(MessageTooLarge) as info:
        protocol.mpub("t", [b"aaaa", b"bbbb"], max_body_size=19)
    assert (info.value.size, info.value.limit) == (20, 19)
    assert protocol.mpub("t", [b"aaaa", b"bbbb"], max_body_size=20)
    with pytest.raises(MessageTooLarge):
        protocol.mpub("t", [b"ok", b"toolong"], max_size=3)
    with pytest.raises(LocalProtocolError, match="empty"):
        protocol.mpub("t", [b"ok", b""])


def test_rdy() -> None:
    assert protocol.rdy(0) == b"RDY 0\n"
    assert protocol.rdy(1) == b"RDY 1\n"
    assert protocol.rdy(2500) == b"RDY 2500\n"
    assert protocol.rdy(5000, max_rdy_count=5000) == b"RDY 5000\n"


@pytest.mark.parametrize("count", [-1, 2501, 1.0, "1", True, None])
def test_rdy_out_of_range(count: object) -> None:
    with pytest.raises(LocalProtocolError, match="RDY"):
        protocol.rdy(count)  # type: ignore[arg-type]


def test_rdy_custom_max() -> None:
    with pytest.raises(LocalProtocolError, match=r"0\.\.100"):
        protocol.rdy(101, max_rdy_count=100)


def test_fin_req_touch() -> None:
    assert protocol.fin(MSG_ID) == b"FIN 0a1b2c3d4e5f6789\n"
    assert protocol.req(MSG_ID, 0) == b"REQ 0a1b2c3d4e5f6789 0\n"
    assert protocol.req(MSG_ID, 3_600_000) == b"REQ 0a1b2c3d4e5f6789 3600000\n"
    assert protocol.touch(MSG_ID) == b"TOUCH 0a1b2c3d4e5f6789\n"


@pytest.mark.parametrize("bad_id", [b"", b"0a1b2c3d4e5f678", b"0a1b2c3d4e5f67890"])
def test_bad_message_id(bad_id: bytes) -> None:
    for encode in (protocol.fin, protocol.touch, lambda i: protocol.req(i, 0)):
        with pytest.raises(LocalProtocolError, match="16 bytes"):
            encode(bad_id)


@pytest.mark.parametrize("delay", [-1, 3_600_001, 1.5, True, "10"])
def test_req_and_dpub_delay_bounds(delay: object) -> None:
    with pytest.raises(LocalProtocolError, match="REQ delay"):
        protocol.req(MSG_ID, delay)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="DPUB delay"):
        protocol.dpub("t", delay, b"x")  # type: ignore[arg-type]


def test_delay_custom_max() -> None:
    assert protocol.req(MSG_ID, 10, max_delay_ms=10) == b"REQ 0a1b2c3d4e5f6789 10\n"
    with pytest.raises(LocalProtocolError):
        protocol.req(MSG_ID, 11, max_delay_ms=10)
    with pytest.raises(LocalProtocolError):
        protocol.dpub("t", 11, b"x", max_delay_ms=10)


def test_cls_nop() -> None:
    assert protocol.cls() == b"CLS\n"
    assert protocol.nop() == b"NOP\n"


# --- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a", "a" * 64, "clicks", "Clicks.v1-2_x", "c#ephemeral", "a" * 54 + "#ephemeral", "..."],
)
def test_valid_names(name: str) -> None:
    assert protocol.is_valid_name(name)
    assert protocol.check_topic(name) == name
    assert protocol.check_channel(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a" * 65,
        "a" * 55 + "#ephemeral",
        "#ephemeral",
        "bad!topic",
        "with space",
        "tab\t",
        "slash/",
        "colon:",
        "tópico",
        "a#other",
        "a#ephemeral#ephemeral",
        "abc\n",  # a newline would end the command line early
        "abc\nFIN 0000000000000000",
    ],
)
def test_invalid_names(name: str) -> None:
    assert not protocol.is_valid_name(name)
    with pytest.raises(InvalidName, match="topic name"):
        protocol.check_topic(name)
    with pytest.raises(InvalidName, match="channel name"):
        protocol.check_channel(name)
    with pytest.raises(InvalidName):
        protocol.sub(name, "c")
    with pytest.raises(InvalidName):
        protocol.sub("t", name)
    with pytest.raises(InvalidName):
        protocol.pub(name, b"x")


def test_name_must_be_str() -> None:
    with pytest.raises(InvalidName, match="must be a str"):
        protocol.check_topic(b"clicks")  # type: ignore[arg-type]


def test_invalid_name_is_a_configuration_error() -> None:
    with pytest.raises(ValueError):
        protocol.check_topic("")


def test_bodies() -> None:
    with pytest.raises(LocalProtocolError, match="empty"):
        protocol.pub("t", b"")
    with pytest.raises(LocalProtocolError, match="must be bytes"):
        protocol.pub("t", "text")  # type: ignore[arg-type]
    with pytest.raises(MessageTooLarge) as info:
        protocol.pub("t", b"x" * 11, max_size=10)
    assert (info.value.size, info.value.limit) == (11, 10)
    assert "--max-msg-size" in str(info.value)
    assert protocol.pub("t", b"x" * 10, max_size=10)
    with pytest.raises(LocalProtocolError, match="empty"):
        protocol.dpub("t", 0, b"")
    with pytest.raises(MessageTooLarge):
        protocol.dpub("t", 0, b"xx", max_size=1)


# --- decoder ---------------------------------------------------------------------------


def test_decode_response_error_message() -> None:
    message = struct.pack(">qH", 1_700_000_000_000_000_000, 3) + MSG_ID + b"body"
    data = raw_frame(0, b"OK") + raw_frame(1, b"E_BAD_TOPIC bad topic") + raw_frame(2, message)
    frames = Decoder().feed(data)
    assert typed(frames) == typed(
        [
            Response(b"OK"),
            ErrorFrame(b"E_BAD_TOPIC bad topic"),
            MessageFrame(1_700_000_000_000_000_000, 3, MSG_ID, b"body"),
        ]
    )
    assert isinstance(frames[1], ErrorFrame)
    assert frames[1].code == "E_BAD_TOPIC"
    assert NSQDError.from_frame(frames[1].data).code == "E_BAD_TOPIC"


def test_decode_exact_bytes() -> None:
    assert Decoder().feed(b"\x00\x00\x00\x06\x00\x00\x00\x00OK") == [Response(b"OK")]
    heartbeat = b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert Decoder().feed(heartbeat) == [Response(protocol.HEARTBEAT)]


def test_decode_empty_payloads() -> None:
    assert typed(Decoder().feed(raw_frame(0, b"") + raw_frame(1, b""))) == typed(
        [Response(b""), ErrorFrame(b"")]
    )
    assert ErrorFrame(b"").code == ""
    message = struct.pack(">qH", 0, 1) + MSG_ID
    assert Decoder().feed(raw_frame(2, message)) == [MessageFrame(0, 1, MSG_ID, b"")]


def test_decode_partial_and_take_buffer() -> None:
    data = raw_frame(0, b"OK") + raw_frame(0, b"CLOSE_WAIT")
    decoder = Decoder()
    assert decoder.feed(data[:3]) == []
    assert decoder.feed(data[3:10]) == [Response(b"OK")]
    assert len(decoder) == 0
    decoder.receive(data[10:15])
    assert decoder.next_frame() is None
    assert len(decoder) == 5
    assert decoder.take_buffer() == data[10:15]
    assert len(decoder) == 0
    assert decoder.next_frame() is None


def test_next_frame_one_at_a_time() -> None:
    decoder = Decoder()
    decoder.receive(raw_frame(0, b"a") + raw_frame(0, b"b") + b"\x00\x00")
    assert decoder.next_frame() == Response(b"a")
    assert decoder.next_frame() == Response(b"b")
    assert decoder.next_frame() is None
    assert decoder.take_buffer() == b"\x00\x00"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (struct.pack(">iI", 3, 0) + b"abc", "outside"),
        (struct.pack(">iI", -1, 0), "outside"),
        (struct.pack(">iI", 6, 3) + b"OK", "unknown frame type 3"),
        (raw_frame(2, b"x" * 25), "too short"),
    ],
)
def test_decode_garbage(data: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        Decoder().feed(data)
    decoder = Decoder()
    decoder.receive(data)
    with pytest.raises(RemoteProtocolError, match=match):
        decoder.next_frame()


def test_oversize_frame_raises_on_the_header_alone() -> None:
    # Only the 8 header bytes arrive: the decoder must refuse without waiting for
    # (or allocating) the announced 2 GiB.
    with pytest.raises(RemoteProtocolError, match=r"outside 4\.\.1024"):
        Decoder(max_frame_size=1024).feed(struct.pack(">iI", 1025, 0))
    with pytest.raises(RemoteProtocolError, match="outside"):
        Decoder().feed(struct.pack(">iI", 2**31 - 1, 2))
    assert Decoder(max_frame_size=1024).feed(raw_frame(0, b"x" * 1020)) == [Response(b"x" * 1020)]


def test_encode_frame() -> None:
    assert encode_frame(Response(b"OK")) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert encode_frame(ErrorFrame(b"E_X")) == b"\x00\x00\x00\x07\x00\x00\x00\x01E_X"
    message = MessageFrame(5, 2, MSG_ID, b"b")
    assert encode_frame(message) == raw_frame(2, struct.pack(">qH", 5, 2) + MSG_ID + b"b")


# --- properties ------------------------------------------------------------------------

frames_strategy = st.lists(
    st.one_of(
        st.builds(Response, st.binary(max_size=64)),
        st.builds(ErrorFrame, st.binary(max_size=64)),
        st.builds(
            MessageFrame,
            st.integers(-(2**63), 2**63 - 1),
            st.integers(0, 2**16 - 1),
            st.binary(min_size=16, max_size=16),
            st.binary(max_size=200),
        ),
    ),
    max_size=20,
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(frames=frames_strategy, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_any_split_decodes_the_same(frames: list[Frame], cuts: list[int]) -> None:
    data = b"".join(encode_frame(f) for f in frames)
    chunks = split(data, cuts)

    fed = Decoder()
    got_fed: list[Frame] = []
    for chunk in chunks:
        got_fed.extend(fed.feed(chunk))
    assert typed(got_fed) == typed(frames)
    assert len(fed) == 0

    pulled = Decoder()
    got_pulled: list[Frame] = []
    for chunk in chunks:
        pulled.receive(chunk)
        while (frame := pulled.next_frame()) is not None:
            got_pulled.append(frame)
    assert typed(got_pulled) == typed(frames)


def feed_into_all(decoder: Decoder, chunks: list[bytes]) -> list[Frame]:
    got: list[Frame] = []

    def on_message(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> None:
        got.append(MessageFrame(timestamp, attempts, message_id, body))

    for chunk in chunks:
        count = decoder.feed_into(chunk, on_message, got.append)
        assert count >= 0
    return got


@given(frames=frames_strategy, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_feed_into_hands_on_the_same_frames_in_order(frames: list[Frame], cuts: list[int]) -> None:
    data = b"".join(encode_frame(f) for f in frames)
    decoder = Decoder()
    assert typed(feed_into_all(decoder, split(data, cuts))) == typed(frames)
    assert len(decoder) == 0


@given(frames=frames_strategy, fail_at=st.integers(min_value=0, max_value=40))
def test_feed_into_resumes_after_a_failing_callback(frames: list[Frame], fail_at: int) -> None:
    # A callback that raises must neither lose nor replay frames.
    data = b"".join(encode_frame(f) for f in frames)
    got: list[Frame] = []
    calls = 0

    def record(frame: Frame) -> None:
        nonlocal calls
        calls += 1
        got.append(frame)
        if calls == fail_at:
            raise RuntimeError("handler bug")

    def on_message(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> None:
        record(MessageFrame(timestamp, attempts, message_id, body))

    decoder = Decoder()
    chunk = data
    while True:
        try:
            decoder.feed_into(chunk, on_message, record)
            break
        except RuntimeError:
            chunk = b""
    assert typed(got) == typed(frames)


@settings(max_examples=200)
@given(data=st.binary(max_size=300))
def test_feed_into_agrees_with_feed_on_random_bytes(data: bytes) -> None:
    try:
        expected = Decoder().feed(data)
    except RemoteProtocolError:
        with pytest.raises(RemoteProtocolError):
            feed_into_all(Decoder(), [data])
        return
    assert typed(feed_into_all(Decoder(), [data])) == typed(expected)


@given(frames=frames_strategy, cut=st.integers(min_value=0))
def test_take_buffer_returns_the_undecoded_rest(frames: list[Frame], cut: int) -> None:
    data = b"".join(encode_frame(f) for f in frames)
    decoder = Decoder()
    decoder.receive(data)
    first = decoder.next_frame() if frames else None
    rest = decoder.take_buffer()
    consumed = len(encode_frame(first)) if first is not None else 0
    assert rest == data[consumed:]
    assert typed(Decoder().feed(rest)) == typed(frames[1:])


@settings(max_examples=300)
@given(data=st.binary(max_size=300), max_frame_size=st.sampled_from([64, 1024, None]))
def test_random_bytes_only_raise_remote_protocol_error(
    data: bytes, max_frame_size: int | None
) -> None:
    decoder = Decoder() if max_frame_size is None else Decoder(max_frame_size)
    try:
        frames = decoder.feed(data)
    except RemoteProtocolError:
        return
    for frame in frames:
        assert isinstance(frame, Response | ErrorFrame | MessageFrame)
        if isinstance(frame, MessageFrame):
            assert len(frame.id) == 16
    # Whatever decoded re-encodes to the prefix it came from.
    encoded = b"".join(encode_frame(f) for f in frames)
    assert data.startswith(encoded)
    assert len(decoder) == len(data) - len(encoded)
