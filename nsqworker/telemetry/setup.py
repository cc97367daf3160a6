"""OpenTelemetry SDK setup for ``nsqworker run``, from the standard ``OTEL_*`` variables.

Each worker process calls :func:`configure_from_env` once, before its Worker starts.
Nothing here runs per message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

from nsqworker.telemetry.sampling import is_proxy

__all__ = ["configure_from_env"]


def configure_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Install SDK providers from the standard ``OTEL_*`` variables, when asked to.

    Traces go over OTLP/HTTP through a BatchSpanProcessor when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set
    (``OTEL_TRACES_EXPORTER=console`` prints them, ``none`` turns them off); the SDK
    reads ``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` itself (the service is ``nsqworker`` if unnamed).
    Metrics likewise, with ``OTEL_METRICS_EXPORTER`` and ``..._METRICS_ENDPOINT``.
    Providers the application installed are left alone, as is everything when
    ``OTEL_SDK_DISABLED=true``. Returns what it installed: ``{"traces": "otlp", ...}``.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return {}
    tracing = _pick(env, "TRACES") if is_proxy(trace.get_tracer_provider()) else None
    metric = _pick(env, "METRICS") if is_proxy(metrics.get_meter_provider()) else None
    if not tracing and not metric:
        return {}
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "nsqworker"}))
    if tracing:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = SdkTracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(
            ConsoleSpanExporter() if tracing == "console" else _otlp("trace_exporter", "Span")
        ))  # fmt: skip
        trace.set_tracer_provider(provider)
    if metric:
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        kind = "metric_exporter", "Metric"
        reader = PeriodicExportingMetricReader(
            ConsoleMetricExporter() if metric == "console" else _otlp(*kind)
        )
        metrics.set_meter_provider(SdkMeterProvider(metric_readers=[reader], resource=resource))
    return {k: v for k, v in (("traces", tracing), ("metrics", metric)) if v}


def _pick(env: Mapping[str, str], signal: str) -> str | None:
    choice = env.get(f"OTEL_{signal}_EXPORTER", "otlp").split(",")[0].strip().lower()
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    if choice == "otlp" and any(env.get(name) for name in endpoints):
        return "otlp"
    return "console" if choice == "console" else None


def _otlp(module: str, kind: str) -> Any:
    """``OTLP<kind>Exporter()`` over HTTP; it reads its ``OTEL_EXPORTER_OTLP_*`` itself."""
    import importlib

    exporters = importlib.import_module(f"opentelemetry.exporter.otlp.proto.http.{module}")
    return getattr(exporters, f"OTLP{kind}Exporter")()
