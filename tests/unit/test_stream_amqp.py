"""The AMQP 1.0 body fast path reads what rstream's decoder reads; decode never raises."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rstream import AMQPMessage, amqp_decoder

from nsqworker.streams.amqp import Decoded, decode


@given(st.binary(min_size=1, max_size=70_000))  # rstream writes no data section for b""
def test_a_data_section_is_its_body(body: bytes) -> None:
    encoded = bytes(AMQPMessage(body=body))
    assert decode(encoded) == body == bytes(amqp_decoder(encoded).body)


@given(st.binary(min_size=1, max_size=300), st.integers(1, 1000))
def test_a_message_with_properties_goes_to_rstreams_decoder(body: bytes, attempts: int) -> None:
    encoded = bytes(AMQPMessage(body=body, application_properties={"x-attempts": attempts}))
    message = decode(encoded)
    assert isinstance(message, Decoded) and message.error is None
    assert message.body == body
    assert message.properties[b"x-attempts"] == attempts


def test_a_truncated_or_padded_frame_is_not_taken_for_a_body() -> None:
    encoded = bytes(AMQPMessage(body=b"hello"))
    for bad in (encoded[:-1] + b"", encoded + b"\x00"):
        result = decode(bad)
        assert result != b"hello"
        assert not isinstance(result, Decoded) or result.error is None or result.body == bad


@settings(deadline=None)  # the first call imports rstream's decoder
@given(st.binary(max_size=200))
def test_garbage_never_raises_and_keeps_its_bytes(data: bytes) -> None:
    """rstream decodes a chunk in one loop: a raise there lost the chunk's other messages."""
    result = decode(data)
    if isinstance(result, Decoded):
        assert isinstance(result.body, bytes)
        if result.error is not None:
            assert result.body == data and result.properties == {}
    else:
        assert isinstance(result, bytes)


def test_an_amqp_value_body_is_read_and_a_non_binary_one_is_an_error() -> None:
    text = decode(bytes(AMQPMessage(body=None, value="hi")))  # type: ignore[arg-type]
    number = decode(bytes(AMQPMessage(body=None, value=7)))  # type: ignore[arg-type]
    assert isinstance(text, Decoded) and (text.body, text.error) == (b"hi", None)
    assert isinstance(number, Decoded) and "AMQP body of type int" in str(number.error)
