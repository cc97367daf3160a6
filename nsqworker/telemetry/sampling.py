"""Sampling decided before a span is built: how the worker's process spans skip the
cost of attributes and a span for messages the tracer's sampler would drop.

For AlwaysOff and TraceIdRatioBased samplers (bare, or the root of a default
ParentBased), :func:`_sampling_plan` lets the worker draw the trace id and decide
itself; :class:`_PresetIds` then hands the SDK that same id, so both decide alike.
"""

from __future__ import annotations

import re
import threading

from opentelemetry import trace
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import sampling
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

__all__ = ["is_proxy"]

# The same values as nsqworker.telemetry.tracing's, which reads the plan.
_LIMIT = (1 << 64) - 1  # TraceIdRatioBased compares the low 64 bits of the trace id
_DISABLED, _GENERIC, _RATIO = 0, 1, 2


class _PresetIds(IdGenerator):
    """Gives out, once, a trace id we drew and sampled ourselves; else asks ``inner``.

    So a ratio sampler can be decided before anything is built, and the SDK, sampling
    the same trace id again, agrees (deciding twice on two ids would sample p**2).
    """

    def __init__(self, inner: IdGenerator) -> None:
        self.inner = inner
        self.local = threading.local()

    def generate_trace_id(self) -> int:
        preset: int = getattr(self.local, "trace_id", 0)
        if preset:
            self.local.trace_id = 0
            return preset
        return self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.inner.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


def _no_sdk(provider: trace.TracerProvider) -> bool:
    return isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def is_proxy(provider: object) -> bool:
    """A global provider nobody installed yet (tracing or metrics)."""
    name = type(provider).__name__
    return isinstance(provider, trace.ProxyTracerProvider) or name == "_ProxyMeterProvider"


def _sampling_plan(
    provider: trace.TracerProvider, tracer: trace.Tracer
) -> tuple[int, int, bool, _PresetIds | None]:
    """``(mode, bound, parent_based, preset ids)`` for the tracer's sampler.

    RATIO: AlwaysOff or TraceIdRatioBased, bare or as the root of a default
    ParentBased, decided by us first; GENERIC: the SDK decides (AlwaysOn, others).
    """
    if _no_sdk(provider) or isinstance(tracer, trace.NoOpTracer):
        return _DISABLED, 0, False, None
    if not isinstance(tracer, SdkTracer):
        return _GENERIC, 0, False, None
    root: sampling.Sampler | None = tracer.sampler
    parent_based = isinstance(root, sampling.ParentBased)
    if parent_based:
        root = _default_parent_based_root(tracer.sampler)
    if root is sampling.ALWAYS_OFF:
        return _RATIO, 0, parent_based, None
    if type(root) is not sampling.TraceIdRatioBased or root.bound > _LIMIT:
        return _GENERIC, 0, False, None
    ids = tracer.id_generator
    if type(ids) is RandomIdGenerator:
        ids = tracer.id_generator = _PresetIds(ids)
    if not isinstance(ids, _PresetIds):
        return _GENERIC, 0, False, None  # custom ids (X-Ray...): let the SDK draw them
    return _RATIO, root.bound, parent_based, ids


_ROOT_DESCRIPTION = re.compile(
    r"ParentBased\{root:(AlwaysOffSampler|TraceIdRatioBased\{([^{}]+)\}),"
)


def _default_parent_based_root(sampler: sampling.Sampler) -> sampling.Sampler | None:
    """The root of a ParentBased sampler whose parent rules are the defaults (follow a
    sampled parent, drop an unsampled one) and whose root is AlwaysOff or a ratio; else
    None. Read through the public ``get_description`` only: the sampler is rebuilt from
    it and must describe itself the same way."""
    description: str = sampler.get_description()
    match = _ROOT_DESCRIPTION.match(description)
    if match is None:
        return None
    root: sampling.Sampler
    if match[2] is None:
        root = sampling.ALWAYS_OFF
    else:
        try:
            root = sampling.TraceIdRatioBased(float(match[2]))
        except ValueError:
            return None
    rebuilt: str = sampling.ParentBased(root).get_description()  # type: ignore[no-untyped-call]
    same = rebuilt == description
    return root if same else None
