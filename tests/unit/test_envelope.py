"""The trace envelope: round trips, and raw bodies that must pass through untouched."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nsqworker.telemetry.envelope import (
    ENVELOPE_MAGIC,
    is_envelope,
    unwrap_envelope,
    wrap_envelope,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# Header keys without "=" or newlines, values without newlines; no lone surrogates.
_chars = st.characters(exclude_categories=("Cs",))
keys = st.text(_chars, min_size=1, max_size=20).filter(lambda k: "=" not in k and "\n" not in k)
values = st.text(_chars, max_size=60).filter(lambda v: "\n" not in v)
headers = st.dictionaries(keys, values, max_size=5)


@given(body=st.binary(max_size=4096), header=headers)
@example(body=b"", header={})
@example(body=ENVELOPE_MAGIC + b"\x01nested", header={"traceparent": TRACEPARENT})
def test_unwrap_of_wrap_gives_back_body_and_headers(body: bytes, header: dict[str, str]) -> None:
    wrapped = wrap_envelope(body, header)
    assert wrapped.startswith(ENVELOPE_MAGIC)
    assert is_envelope(wrapped)
    assert unwrap_envelope(wrapped) == (body, header)


@given(raw=st.binary(max_size=4096))
@example(raw=b"")
@example(raw=ENVELOPE_MAGIC)
@example(raw=ENVELOPE_MAGIC + b"\x01\x00\x00")
@example(raw=ENVELOPE_MAGIC + b"\x01\x00\x00" + b"\x00\x00\x00\x00body")
def test_raw_bytes_come_back_unchanged(raw: bytes) -> None:
    body, header = unwrap_envelope(raw)
    assert header is None
    assert body is raw


@given(tail=st.binary(max_size=512))
def test_raw_bytes_starting_with_the_magic_come_back_unchanged(tail: bytes) -> None:
    raw = ENVELOPE_MAGIC + tail
    body, header = unwrap_envelope(raw)
    assert (body, header) == (raw, None)
    assert body is raw


@given(text=st.text(_chars, max_size=200))
def test_utf8_text_is_never_an_envelope(text: str) -> None:
    raw = text.encode()
    assert not is_envelope(raw)
    assert unwrap_envelope(raw)[0] is raw


@given(
    body=st.binary(max_size=64),
    header=headers,
    position=st.integers(min_value=0),
    flip=st.integers(min_value=1, max_value=255),
)
def test_any_damaged_byte_in_the_frame_turns_it_raw(
    body: bytes, header: dict[str, str], position: int, flip: int
) -> None:
    wrapped = wrap_envelope(body, header)
    frame_size = len(wrapped) - len(body)  # magic, version, length, header, CRC
    index = position % frame_size
    damaged = bytearray(wrapped)
    damaged[index] ^= flip
    raw = bytes(damaged)
    assert unwrap_envelope(raw) == (raw, None)


@given(body=st.binary(max_size=64), header=headers, cut=st.integers(min_value=0))
def test_a_truncated_frame_turns_it_raw(body: bytes, header: dict[str, str], cut: int) -> None:
    wrapped = wrap_envelope(body, header)
    raw = wrapped[: cut % (len(wrapped) - len(body))]
    assert unwrap_envelope(raw) == (raw, None)


def test_matching_crc_with_a_malformed_header_is_raw() -> None:
    for header in (b"no-equals-sign", b"=value", b"a=1\na=2", b"\xff\xfe=bad-utf8"):
        framed = ENVELOPE_MAGIC + b"\x01" + len(header).to_bytes(2, "big") + header
        raw = framed + zlib.crc32(framed).to_bytes(4, "big") + b"body"
        assert unwrap_envelope(raw) == (raw, None)
        assert not is_envelope(raw)


def test_unknown_version_is_passed_through() -> None:
    framed = ENVELOPE_MAGIC + b"\x02" + (0).to_bytes(2, "big")
    raw = framed + zlib.crc32(framed).to_bytes(4, "big") + b"body"
    assert unwrap_envelope(raw) == (raw, None)


def test_wire_format_is_stable() -> None:
    """A known vector, for other languages writing or reading envelopes."""
    wrapped = wrap_envelope(b'{"id":1}', {"traceparent": TRACEPARENT})
    header = f"traceparent={TRACEPARENT}".encode()
    framed = b"\xc1\xffNW\x01" + len(header).to_bytes(2, "big") + header
    assert wrapped == framed + zlib.crc32(framed).to_bytes(4, "big") + b'{"id":1}'
    assert wrapped.hex() == (
        "c1ff4e57010043" + header.hex() + "8495050b" + b'{"id":1}'.hex()
    )  # magic+version, header length 67, header, CRC-32, body


@pytest.mark.parametrize(
    "header",
    [{"": "x"}, {"a=b": "x"}, {"a\nb": "x"}, {"a": "x\ny"}, {"a": "x" * 70_000}],
)
def test_wrap_refuses_headers_it_could_not_read_back(header: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        wrap_envelope(b"body", header)
