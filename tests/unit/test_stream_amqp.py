"""The AMQP 1.0 body fast path reads what rstream's decoder reads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rstream import AMQPMessage, amqp_decoder

from nsqworker.streams.amqp import decode


@given(st.binary(min_size=1, max_size=70_000))  # rstream writes no data section for b""
def test_a_data_section_is_its_body(body: bytes) -> None:
    encoded = bytes(AMQPMessage(body=body))
    assert decode(encoded) == body == bytes(amqp_decoder(encoded).body)


@given(st.binary(min_size=1, max_size=300), st.integers(1, 1000))
def test_a_message_with_properties_goes_to_rstreams_decoder(body: bytes, attempts: int) -> None:
    encoded = bytes(AMQPMessage(body=body, application_properties={"x-attempts": attempts}))
    message = decode(encoded)
    assert bytes(message.body) == body
    assert message.application_properties[b"x-attempts"] == attempts


def test_a_truncated_or_padded_frame_is_not_taken_for_a_body() -> None:
    encoded = bytes(AMQPMessage(body=b"hello"))
    for bad in (encoded[:-1] + b"", encoded + b"\x00"):
        try:
            result = decode(bad)
        except Exception:
            continue  # rstream's decoder refuses it: fine, never a wrong body
        assert result != b"hello" or bad == encoded
