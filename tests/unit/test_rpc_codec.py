"""nsqworker.rpc.codec at the byte level: vectors written by hand from the seed's table
(shared/protocol/rpc-over-nsq.md), property tests for round trips and truncations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqworker.errors import InvalidName, LocalProtocolError, RpcDecodeError
from nsqworker.rpc import codec
from nsqworker.rpc.codec import Request, Response

ID = bytes(range(16))  # 00 01 02 ... 0f

# vsn | id | encoding | len(host) | len(topic) | port | host | topic | body
REQUEST_VECTOR = (
    b"\x00"  # version 0
    b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"  # id
    b"\x01"  # encoding 1: JSON
    b"\x09"  # len("127.0.0.1")
    b"\x05"  # len("rpc_r")
    b"\x00\x00\x10\x36"  # port 4150, four bytes big-endian
    b"127.0.0.1"
    b"rpc_r"
    b'{"a":1}'
)
# vsn | id | encoding | body
RESPONSE_VECTOR = (
    b'\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x01{"price":42}'
)
# vsn | id | 0xff
UNSUPPORTED_VECTOR = b"\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\xff"


# --- fixed vectors --------------------------------------------------------------------


def test_request_vector() -> None:
    encoded = codec.encode_request(ID, codec.JSON, "127.0.0.1", 4150, "rpc_r", b'{"a":1}')
    assert encoded == REQUEST_VECTOR
    assert len(encoded) == 24 + 9 + 5 + 7
    assert codec.decode_request(REQUEST_VECTOR) == Request(
        ID, 1, "127.0.0.1", 4150, "rpc_r", b'{"a":1}'
    )


def test_request_vector_large_port_and_ephemeral_topic() -> None:
    topic = "rpc_" + "ab" * 16 + "#ephemeral"  # what RpcClient uses: 46 characters
    data = codec.encode_request(b"\xff" * 16, codec.MSGPACK, "::1", 65535, topic, b"\x81")
    assert data[:18] == b"\x00" + b"\xff" * 16 + b"\x03"
    assert data[18:24] == b"\x03\x2e\x00\x00\xff\xff"
    assert data[24:] == b"::1" + topic.encode() + b"\x81"


def test_request_with_empty_body() -> None:
    data = codec.encode_request(ID, codec.BINARY, "h", 1, "t", b"")
    assert data == b"\x00" + ID + b"\x00\x01\x01\x00\x00\x00\x01ht"
    assert codec.decode_request(data).body == b""


def test_response_vectors() -> None:
    assert codec.encode_response(ID, codec.JSON, b'{"price":42}') == RESPONSE_VECTOR
    assert codec.decode_response(RESPONSE_VECTOR) == Response(ID, 1, b'{"price":42}')
    assert codec.unsupported_reply(ID) == UNSUPPORTED_VECTOR
    assert codec.decode_response(UNSUPPORTED_VECTOR) == Response(ID, 255, b"")
    assert codec.encode_response(ID, codec.BINARY, b"") == b"\x00" + ID + b"\x00"


def test_reply_address_builds_the_same_bytes() -> None:
    address = codec.ReplyAddress("127.0.0.1", 4150, "rpc_r")
    assert address.request(ID, codec.JSON, b'{"a":1}') == REQUEST_VECTOR


# --- decode errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "0 bytes, shorter than its 24-byte header"),
        (b"\x01" + REQUEST_VECTOR[1:], "version 1; this side speaks version 0"),
        (b"\x07", "version 7"),
        (REQUEST_VECTOR[:30], "too short for its 9-byte host and 5-byte topic (needs 38)"),
        (REQUEST_VECTOR[:18] + b"\x00" + REQUEST_VECTOR[19:], "empty reply host"),
        (REQUEST_VECTOR[:20] + b"\x00\x00\x00\x00" + REQUEST_VECTOR[24:], "reply port 0"),
        (REQUEST_VECTOR[:20] + b"\x00\x01\x00\x00" + REQUEST_VECTOR[24:], "reply port 65536"),
        (REQUEST_VECTOR[:33] + b"rpc r" + REQUEST_VECTOR[38:], "'rpc r' is not a valid NSQ"),
        (REQUEST_VECTOR[:24] + b"\xff" + REQUEST_VECTOR[25:], "not ASCII"),
    ],
)
def test_bad_requests(data: bytes, words: str) -> None:
    """Each header that cannot be read is named; an unknown encoding is no such error."""
    with pytest.raises(RpcDecodeError, match="RPC request") as info:
        codec.decode_request(data)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "0 bytes, shorter than its 18-byte header"),
        (RESPONSE_VECTOR[:17], "17 bytes"),
        (b"\x02" + RESPONSE_VECTOR[1:], "version 2"),
        (UNSUPPORTED_VECTOR + b"x", "carries 1 body bytes; it must have none"),
        (RESPONSE_VECTOR[:17] + b"\xfe", "reserved encoding 254"),
    ],
)
def test_bad_responses(data: bytes, words: str) -> None:
    with pytest.raises(RpcDecodeError, match="RPC") as info:
        codec.decode_response(data)
    assert words in str(info.value)


# --- encode errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"host": ""}, LocalProtocolError, "non-empty"),
        ({"host": "h" * 256}, LocalProtocolError, "256 bytes, more than the 255"),
        ({"host": "hôte"}, LocalProtocolError, "not ASCII"),
        ({"port": 0}, LocalProtocolError, "port must be 1 to 65535"),
        ({"port": 70000}, LocalProtocolError, "port must be 1 to 65535"),
        ({"port": True}, LocalProtocolError, "port"),
        ({"topic": "bad topic"}, InvalidName, "invalid topic name"),
        ({"topic": "t" * 65}, InvalidName, "invalid topic name"),
        ({"id": b"short"}, LocalProtocolError, "16 bytes"),
        ({"encoding": 255}, LocalProtocolError, "encoding must be 0 to 253"),
    ],
)
def test_request_arguments_are_checked(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    args: dict[str, object] = {
        "id": ID, "encoding": 1, "host": "h", "port": 1, "topic": "t", "body": b"",
    }  # fmt: skip
    args.update(kwargs)
    with pytest.raises(error, match=words):
        codec.encode_request(**args)  # type: ignore[arg-type]


def test_response_arguments_are_checked() -> None:
    with pytest.raises(LocalProtocolError, match="16 bytes"):
        codec.encode_response(b"x" * 15, codec.JSON, b"{}")
    with pytest.raises(LocalProtocolError, match="0 to 253"):
        codec.encode_response(ID, codec.UNSUPPORTED, b"")
    with pytest.raises(LocalProtocolError, match="16 bytes"):
        codec.unsupported_reply(b"")


# --- values ---------------------------------------------------------------------------


def test_encodings_by_name_and_code() -> None:
    assert codec.encoding_code("json") == codec.JSON
    assert codec.encoding_code("MsgPack") == codec.MSGPACK
    assert codec.encoding_code(0) == codec.BINARY
    assert codec.encoding_name(255) == "unsupported"
    assert codec.encoding_name(9) == "encoding 9"
    with pytest.raises(LocalProtocolError, match="unknown RPC encoding 'xml'; use one of"):
        codec.encoding_code("xml")
    with pytest.raises(LocalProtocolError, match="from 0 to 253"):
        codec.encoding_code(254)
    with pytest.raises(LocalProtocolError, match="bert is not available"):
        codec.encoding_codes(["json", "bert"])
    assert codec.supported_encodings() >= {codec.BINARY, codec.JSON, codec.MSGPACK}


def test_value_codecs() -> None:
    assert codec.encode_value(codec.JSON, {"sku": "Ä1"}) == '{"sku":"Ä1"}'.encode()
    assert codec.decode_value(codec.JSON, b'{"a":[1,2]}') == {"a": [1, 2]}
    assert codec.encode_value(codec.BINARY, bytearray(b"ab")) == b"ab"
    assert codec.decode_value(codec.BINARY, b"\x00\xff") == b"\x00\xff"
    assert codec.encode_value(codec.MSGPACK, {"a": b"\x00"}) == b"\x81\xa1a\xc4\x01\x00"
    assert codec.decode_value(codec.MSGPACK, b"\x81\xa1a\xc4\x01\x00") == {"a": b"\x00"}


def test_value_errors_are_clear() -> None:
    with pytest.raises(LocalProtocolError, match="cannot encode set as JSON"):
        codec.encode_value(codec.JSON, {1, 2})
    with pytest.raises(LocalProtocolError, match="binary RPC encoding carries bytes, got dict"):
        codec.encode_value(codec.BINARY, {})
    with pytest.raises(LocalProtocolError, match="cannot encode object as msgpack"):
        codec.encode_value(codec.MSGPACK, object())
    with pytest.raises(LocalProtocolError, match="bert is not available"):
        codec.encode_value(codec.BERT, 1)
    with pytest.raises(RpcDecodeError, match="not JSON"):
        codec.decode_value(codec.JSON, b"{")
    with pytest.raises(RpcDecodeError, match="not JSON"):
        codec.decode_value(codec.JSON, b"\xff")
    with pytest.raises(RpcDecodeError, match="not msgpack"):
        codec.decode_value(codec.MSGPACK, b"\xc1")
    with pytest.raises(RpcDecodeError, match="not msgpack"):
        codec.decode_value(codec.MSGPACK, b"\x92\x01")  # an array of 2 with 1 element
    with pytest.raises(RpcDecodeError, match="bert cannot be decoded"):
        codec.decode_value(codec.BERT, b"\x83")


# --- properties -----------------------------------------------------------------------

ids = st.binary(min_size=16, max_size=16)
request_encodings = st.integers(0, 253)
hosts = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=255)
ports = st.integers(1, 65535)
topics = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)
bodies = st.binary(max_size=300)


@given(ids, request_encodings, hosts, ports, topics, bodies)
def test_request_round_trip(
    id: bytes, encoding: int, host: str, port: int, topic: str, body: bytes
) -> None:
    data = codec.encode_request(id, encoding, host, port, topic, body)
    assert len(data) == 24 + len(host) + len(topic) + len(body)
    assert codec.decode_request(data) == Request(id, encoding, host, port, topic, body)


@given(ids, st.integers(0, 253), bodies)
def test_response_round_trip(id: bytes, encoding: int, body: bytes) -> None:
    data = codec.encode_response(id, encoding, body)
    assert codec.decode_response(data) == Response(id, encoding, body)


@given(ids, request_encodings, hosts, ports, topics, bodies)
def test_every_request_truncation_fails_cleanly(
    id: bytes, encoding: int, host: str, port: int, topic: str, body: bytes
) -> None:
    data = codec.encode_request(id, encoding, host, port, topic, body)
    header_end = 24 + len(host) + len(topic)
    for cut in range(header_end):
        with pytest.raises(RpcDecodeError, match="RPC request"):
            codec.decode_request(data[:cut])
    # No length field for the body: a cut inside it is a shorter body, by design.
    for cut in range(header_end, len(data) + 1):
        assert codec.decode_request(data[:cut]).body == body[: cut - header_end]


@given(ids, st.integers(0, 253), bodies)
def test_every_response_truncation_fails_cleanly(id: bytes, encoding: int, body: bytes) -> None:
    data = codec.encode_response(id, encoding, body)
    for cut in range(18):
        with pytest.raises(RpcDecodeError, match="RPC response"):
            codec.decode_response(data[:cut])


@given(st.binary(max_size=120))
def test_any_bytes_decode_or_fail_with_rpc_decode_error(data: bytes) -> None:
    for decode in (codec.decode_request, codec.decode_response):
        try:
            decode(data)
        except RpcDecodeError:
            pass


@given(st.sampled_from(sorted(codec.supported_encodings())), st.binary(max_size=64))
def test_any_body_decodes_or_fails_with_rpc_decode_error(encoding: int, body: bytes) -> None:
    try:
        codec.decode_value(encoding, body)
    except RpcDecodeError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(st.sampled_from([codec.JSON, codec.MSGPACK]), json_values)
def test_value_round_trip(encoding: int, value: object) -> None:
    assert codec.decode_value(encoding, codec.encode_value(encoding, value)) == value


def test_without_msgpack_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "msgpack", None)
    assert codec.supported_encodings() == {codec.BINARY, codec.JSON}
    with pytest.raises(LocalProtocolError, match=r"msgpack is not available here \(pip install"):
        codec.encoding_codes(["msgpack"])
    with pytest.raises(LocalProtocolError, match="msgpack is not available"):
        codec.encode_value(codec.MSGPACK, {})
    with pytest.raises(RpcDecodeError, match="msgpack cannot be decoded here"):
        codec.decode_value(codec.MSGPACK, b"\x80")


@pytest.mark.parametrize("encoding", [2, 4, 253, 254, 255])
def test_a_request_in_an_unknown_or_reserved_encoding_still_gives_its_reply_address(
    encoding: int,
) -> None:
    request = codec.decode_request(REQUEST_VECTOR[:17] + bytes([encoding]) + REQUEST_VECTOR[18:])
    assert (request.encoding, request.host, request.port, request.topic) == (
        encoding,
        "127.0.0.1",
        4150,
        "rpc_r",
    )
