"""OpenTelemetry around the layers below: spans and metrics for tasks and publishes.

:mod:`.tracing` makes the CONSUMER and PRODUCER spans, :mod:`.metrics` the worker's
observable instruments, :mod:`.envelope` carries trace context through a message
body, :mod:`.setup` configures the SDK from ``OTEL_*`` variables. Nothing in
:mod:`nsqworker.nsq` imports this package.
"""
