"""Publishing what a handler returns: ``@task(publish_to=...)`` and :class:`Publish`.

A handler's return value is ignored unless the task has ``publish_to`` or the value is a
:class:`~nsqworker.outcomes.Publish` (or a list of them). Those are published on the
task's own transport, in order, before the message is acknowledged, within the handler's
span; with ``tracing_envelope`` on, the trace context travels with them in the trace
envelope, so the next task's span continues this trace. A publish that fails fails the
attempt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate

from nsqworker.message import Message, to_bytes
from nsqworker.outcomes import Publish
from nsqworker.telemetry.envelope import wrap_envelope

if TYPE_CHECKING:
    from nsqworker.transport import Transport

__all__ = ["encode_body", "planned", "publish_results"]


def planned(value: Any, publish_to: str | None) -> list[Publish]:
    """What a handler's return ``value`` publishes: its :class:`Publish` values, or the
    value itself to ``publish_to``; nothing for None (or anything, without publish_to).

    Raises:
        TypeError: a list mixing :class:`Publish` values with other ones.
    """
    if value is None:
        return []
    if isinstance(value, Publish):
        return [value]
    if isinstance(value, list | tuple) and value:
        publishes = [item for item in value if isinstance(item, Publish)]
        if len(publishes) == len(value):
            return publishes
        if publishes:
            raise TypeError(
                "the handler returned a list mixing Publish(...) with other values; "
                "return only Publish values, or one value for publish_to"
            )
    if publish_to is None:
        return []  # a return value is ignored without publish_to, as it always was
    return [Publish(publish_to, value)]


def encode_body(body: Any) -> bytes:
    """A returned body as bytes: what ``Producer.publish`` takes (bytes, str, a pydantic
    model, a dataclass), else its compact UTF-8 JSON.

    Raises:
        TypeError: neither (naming the type), or a body that is empty.
    """
    try:
        data = to_bytes(body)
    except TypeError:
        try:
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"cannot publish a {type(body).__name__} the handler returned: give bytes, "
                f"str, a JSON value, a pydantic model or a dataclass ({exc})"
            ) from None
    if not data:
        raise TypeError("the handler returned an empty body to publish; brokers refuse those")
    return data


async def publish_results(
    transport: Transport, msg: Message, messages: Sequence[Publish], *, envelope: bool
) -> None:
    """Publish ``messages`` in order on ``transport``; any failure propagates.

    ``envelope``: carry the current trace context on in the trace envelope (the
    ``tracing_envelope`` setting), so the next task's span continues this trace. A
    transport with ``results_publisher(near, envelope)`` (NSQ: its producer wraps, with
    its send span) is asked for its producer; on the others the body is wrapped here."""
    results = getattr(transport, "results_publisher", None)
    if callable(results):
        producer, wrap = results(msg, envelope), False
    else:
        producer, wrap = transport.publisher(msg), envelope
    for item in messages:
        topic = transport.check_topic(item.topic)
        body = encode_body(item.body)
        if wrap:
            body = _in_envelope(body)
        if item.delay:
            await producer.publish(topic, body, delay=item.delay)
        else:
            await producer.publish(topic, body)


def _in_envelope(body: bytes) -> bytes:
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return wrap_envelope(body, headers) if headers else body
