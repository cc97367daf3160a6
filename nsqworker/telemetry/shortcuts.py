"""Two per-message steps the OpenTelemetry SDK's public API makes slow, done cheaper.

With every message sampled, nsqworker does per message, besides the span itself:
make the Context the handler runs in, and record the outcome event. Measured in a
loop on the CI machine (opentelemetry-sdk 1.45, a span with 11 attributes ~57 us):

* ``trace.set_span_in_context(span, parent)`` copies ``parent`` twice: 2.0 us. When
  it is empty (a process span without a remote parent, the usual case)
  :func:`context_with` builds the one-entry Context directly: 1.1 us. The key is
  learned once through the public API, not imported from a private name.
* ``span.add_event("fin")`` wraps the absent attributes in a fresh BoundedAttributes
  and goes through a locked check: 7.9 us. :func:`add_plain_event` appends a
  prebuilt-shape event to the SDK span's own bounded event list: 1.8 us.

The event shortcut uses SDK internals (``Span._events``, ``Event``'s fields). It is
checked once, at import, against what the public API produces, and once per span
class; anything that does not match (another SDK version, a vendor's span) takes the
public call. ``tests/unit/test_otel_shortcuts.py`` fails if the shortcut stops being taken
with the pinned SDK, so an upgrade that breaks it is noticed, not silently slower.
"""

from __future__ import annotations

from time import time_ns

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList

__all__ = ["add_plain_event", "context_with", "direct_events"]

_SPAN_KEY: str = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, Context())))
_NO_ATTRIBUTES = BoundedAttributes(immutable=True)  # what add_event(name) stores, shared


def context_with(span: trace.Span, parent: Context) -> Context:
    """``trace.set_span_in_context(span, parent)``, one copy cheaper for an empty one."""
    if parent:
        return trace.set_span_in_context(span, parent)
    return Context({_SPAN_KEY: span})


class _PlainEvent(Event):
    """An event with no attributes, made with one ``__init__`` instead of two."""

    _attributes = _NO_ATTRIBUTES

    def __init__(self, name: str) -> None:
        self._name = name
        self._timestamp = time_ns()


def _event_shape_ok() -> bool:
    """Does ``_PlainEvent`` read back as ``Event(name)`` from the public API does?"""
    try:
        made, public = _PlainEvent("fin"), Event("fin", _NO_ATTRIBUTES)
        return (
            (made.name, dict(made.attributes or {}), made.dropped_attributes)
            == (public.name, dict(public.attributes or {}), public.dropped_attributes)
            and isinstance(made.timestamp, int)
            and made.timestamp > 0
        )
    except Exception:
        return False


_EVENT_SHAPE_OK = _event_shape_ok()
_DIRECT: dict[type, bool] = {}


def direct_events(span: trace.Span) -> bool:
    """True when :func:`add_plain_event` takes the shortcut for this span's class."""
    cls = type(span)
    direct = _DIRECT.get(cls)
    if direct is None:
        direct = (
            _EVENT_SHAPE_OK
            and isinstance(span, SdkSpan)
            and isinstance(getattr(span, "_events", None), BoundedList)
            and hasattr(span, "_end_time")
        )
        _DIRECT[cls] = direct
    return direct


def add_plain_event(span: trace.Span, name: str) -> None:
    """``span.add_event(name)``: an event without attributes, timestamped now."""
    if not direct_events(span):
        span.add_event(name)
    elif span._end_time is None:  # type: ignore[attr-defined]  # as add_event checks
        # BoundedList.append locks and counts what the span's event limit drops.
        span._events.append(_PlainEvent(name))  # type: ignore[attr-defined]
