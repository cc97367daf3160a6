"""Log lines through structlog, in one format for our own loggers and for stdlib ones.

``configure_logging()`` sets up two paths that end in the same renderer on the same stream:

* nsqworker's loggers (``get_logger``) are structlog-native: a disabled level costs one
  method call that returns at once, and an enabled line is rendered without building a
  ``logging.LogRecord``;
* ``logging.getLogger(...)`` records from libraries reach a root handler whose
  ``structlog.stdlib.ProcessorFormatter`` runs the same processors.

Console lines are ``HH:MM:SS.mmm [level] event  key=value ... [logger]``, coloured on a
terminal; JSON lines hold ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``event``
and every bound key. Both carry ``trace_id`` and ``span_id`` inside an OpenTelemetry span.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

from nsqworker.safe_text import one_line

__all__ = ["LEVELS", "add_trace_context", "configure_logging", "get_logger"]
__all__ += ["TrafficSummary", "application_configured_logging", "configure_logging_by_default"]
__all__ += ["every", "histogram_quantile"]

#: Level names accepted by ``configure_logging`` (``warn`` is taken for ``warning``).
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
FORMATS = ("auto", "console", "json")
_FIRST_KEYS = ("timestamp", "level", "logger", "event")
_current_span: Callable[[], Any] | None = None
_explicit = False  # configure_logging was called by code other than an embedded Worker


def _get_current_span() -> Callable[[], Any]:
    """``opentelemetry.trace.get_current_span``, imported on first use; a no-op without it."""
    global _current_span
    if _current_span is None:
        try:
            from opentelemetry.trace import get_current_span
        except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
            _current_span = lambda: None  # noqa: E731
        else:
            _current_span = get_current_span
    return _current_span


def add_trace_context(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Add ``trace_id`` and ``span_id`` (hex) of the current OpenTelemetry span, if any.

    A valid span context is enough: a span that is not sampled still has ids worth
    logging, since they tie the line to the trace the caller started.
    """
    span = _get_current_span()()
    if span is not None:
        ctx = span.get_span_context()
        if ctx.is_valid:
            event_dict.setdefault("trace_id", format(ctx.trace_id, "032x"))
            event_dict.setdefault("span_id", format(ctx.span_id, "016x"))
    return event_dict


def _short_time(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Local wall time as ``HH:MM:SS.mmm`` for console lines."""
    now = time.time()
    event_dict["timestamp"] = time.strftime("%H:%M:%S", time.localtime(now)) + (
        f".{int(now % 1 * 1000):03d}"
    )
    return event_dict


def _strip_event(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Drop the trailing newline some stdlib messages (``warnings``) end with."""
    event = event_dict.get("event")
    if isinstance(event, str):
        event_dict["event"] = event.rstrip()
    return event_dict


def _first_keys(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Put timestamp, level, logger and event first, so JSON lines read left to right."""
    head = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
    head.update(event_dict)
    return head


_MULTILINE_KEYS = frozenset(("exception", "exc_info", "stack"))


def _one_line_values(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Console lines print strings as they are: escape the control characters of every
    value (a message id, a reason quoting a body), so each line is one line and nothing
    in it reaches the terminal as a command. Tracebacks and stacks stay multi-line. JSON
    lines need none of this: JSON escapes them."""
    for key, value in event_dict.items():
        if value.__class__ is str and key not in _MULTILINE_KEYS and not value.isprintable():
            event_dict[key] = one_line(value)
    return event_dict


def _json_default(value: Any) -> Any:
    return str(value)


def _processors(fmt: str, colors: bool) -> tuple[list[Processor], list[Processor]]:
    """The processors before rendering, shared by both paths, and the rendering ones."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        add_trace_context,
        structlog.processors.StackInfoRenderer(),
    ]
    render: list[Processor]
    if fmt == "json":
        shared.append(structlog.processors.TimeStamper(fmt="iso", utc=True))
        render = [
            structlog.processors.format_exc_info,
            _first_keys,
            structlog.processors.JSONRenderer(default=_json_default),
        ]
    else:
        shared.append(_short_time)
        render = [
            _one_line_values,
            structlog.dev.ConsoleRenderer(
                colors=colors,
                # rich's traceback with locals blocks the event loop for tens of ms
                # per failure; a plain one costs well under one.
                exception_formatter=structlog.dev.plain_traceback,
            ),
        ]
    return shared, render


class _Handler(logging.StreamHandler[TextIO]):
    """The root handler ``configure_logging`` installs; found again by its type."""


class _Writer:
    """Where structlog-native lines end: the stream, under the root handler's lock.

    Sharing the lock keeps our lines and stdlib ones from interleaving; ``name`` is
    what ``structlog.stdlib.add_logger_name`` reads.
    """

    def __init__(self, name: str, handler: _Handler) -> None:
        self.name = name
        self._handler = handler

    def msg(self, message: str) -> None:
        """Write one rendered line."""
        stream, lock = self._handler.stream, self._handler.lock
        if lock is None:  # pragma: no cover - handlers always have a lock
            stream.write(message + "\n")
            return
        with lock:
            try:
                stream.write(message + "\n")
                stream.flush()
            except ValueError:  # closed (a CLI runner's capture, gone): stderr keeps it
                if sys.__stderr__ is not None:
                    sys.__stderr__.write(message + "\n")

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


class _WriterFactory:
    """structlog's logger factory: ``get_logger(name)`` calls it with ``name``."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler

    def __call__(self, *args: Any) -> _Writer:
        return _Writer(str(args[0]) if args else "", self._handler)


def configure_logging(
    level: str = "info", fmt: str = "auto", stream: TextIO | None = None, *, _default: bool = False
) -> None:
    """Send every log line, ours and the stdlib's, to ``stream`` (stderr) as console or JSON.

    ``level`` is one of ``LEVELS`` (any case; ``warn`` works too); ``fmt`` is ``console``,
    ``json`` or ``auto`` (console when ``stream`` is a terminal, JSON otherwise); colours
    are used on a terminal unless ``NO_COLOR`` is set. Calling it again replaces the
    previous setup rather than adding to it, and loggers from ``get_logger`` follow;
    loggers derived with ``.bind()`` before the call keep the old one.
    """
    name = level.strip().lower()
    name = "warning" if name == "warn" else name
    if name not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    fmt = fmt.strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    resolved = ("console" if tty else "json") if fmt == "auto" else fmt
    colors = tty and resolved == "console" and "NO_COLOR" not in os.environ
    shared, render = _processors(resolved, colors=colors)
    numeric = LEVELS[name]

    handler = _Handler(out)
    handler.setLevel(numeric)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[_strip_event, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    structlog.configure(
        processors=[*shared, *render],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_WriterFactory(handler),
        cache_logger_on_first_use=True,
    )
    for lazy in list(_LAZY_LOGGERS):
        lazy.drop_configuration()
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    global _explicit
    _explicit = _explicit or not _default
    # httpx logs every lookupd poll at INFO; only its problems are worth a line.
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))
    logging.captureWarnings(True)


def application_configured_logging() -> bool:
    """True when something other than an embedded ``Worker`` has set up logging.

    That is: ``configure_logging`` was called (``nsqworker run`` does it), or the root
    logger has a handler nsqworker did not install (``logging.basicConfig``,
    ``dictConfig``, a framework's setup), or structlog was configured by someone else.
    """
    if _explicit:
        return True
    if any(not isinstance(h, _Handler) for h in logging.getLogger().handlers):
        return True
    if structlog.is_configured():
        return not isinstance(structlog.get_config()["logger_factory"], _WriterFactory)
    return False


def configure_logging_by_default(level: str, fmt: str) -> bool:
    """``configure_logging(level, fmt)`` unless the application set up logging itself
    (see :func:`application_configured_logging`); True if it did configure."""
    if application_configured_logging():
        return False
    configure_logging(level, fmt, _default=True)
    return True


# Attributes a resolved logger copies onto the lazy one, so calls skip ``__getattr__``.
_METHODS = (
    "debug", "info", "warning", "warn", "error", "err", "exception", "critical", "fatal",
    "msg", "log", "adebug", "ainfo", "awarning", "aerror", "aexception", "acritical",
    "afatal", "alog", "bind", "new", "unbind", "try_unbind", "is_enabled_for",
    "get_effective_level",
)  # fmt: skip
_LAZY_LOGGERS: weakref.WeakSet[_LazyLogger] = weakref.WeakSet()


class _LazyLogger:
    """A logger that takes structlog's configuration at its first call.

    structlog's own lazy proxy answers every call through ``__getattr__``, which costs
    a failed attribute lookup (about 2 µs) even for a disabled level. Once the
    configuration allows caching, this one copies the bound logger's methods onto
    itself, so ``log.debug(...)`` at level info is a plain call of a no-op.
    """

    def __init__(self, name: str, initial: dict[str, Any]) -> None:
        self._name = name
        self._initial = initial
        _LAZY_LOGGERS.add(self)

    def drop_configuration(self) -> None:
        """Drop the copied methods, so the next call takes the new configuration."""
        for method in _METHODS:
            self.__dict__.pop(method, None)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        bound = structlog.get_logger(self._name, **self._initial).bind()
        if structlog.get_config()["cache_logger_on_first_use"]:
            for method in _METHODS:
                if hasattr(bound, method):
                    setattr(self, method, getattr(bound, method))
        return getattr(bound, attr)

    def __reduce__(self) -> tuple[Any, ...]:
        return _LazyLogger, (self._name, self._initial)

    def __repr__(self) -> str:
        return f"<nsqworker logger {self._name!r}>"


def get_logger(name: str | None = None, **initial: Any) -> FilteringBoundLogger:
    """A structlog logger whose lines carry ``logger=name`` and the ``initial`` keys.

    ``name`` defaults to the calling module's ``__name__``. Create loggers at import time
    (``log = get_logger(__name__)``); each takes the configuration in force at its first
    call and keeps it until ``configure_logging`` is called again.
    """
    if name is None:
        caller = inspect.currentframe()
        caller = caller.f_back if caller is not None else None
        name = str(caller.f_globals.get("__name__", "nsqworker")) if caller else "nsqworker"
    return cast(FilteringBoundLogger, _LazyLogger(name, initial))


# --- the per-task summary line -------------------------------------------------------


def histogram_quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float:
    """The ``q`` quantile (0-1) of a histogram, interpolated inside its bucket.

    ``counts[i]`` values were at most ``bounds[i]`` (and above ``bounds[i - 1]``); the
    last count is the +Inf bucket, for which the highest bound is returned, as
    Prometheus' ``histogram_quantile`` does. 0.0 for an empty histogram.
    """
    total = sum(counts)
    if not total:
        return 0.0
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            low = bounds[i - 1] if i else 0.0
            return low + (bounds[i] - low) * (rank - seen) / count
        seen += count
    return float(bounds[-1])


class TrafficSummary:
    """What a task did since the last summary: the fields of its periodic info line.

    Fed with the task's running totals (FINs, REQs, dead letters, handler-duration
    histogram counts); :meth:`fields` returns the difference since the previous call,
    or None when nothing was handled, so idle tasks stay quiet.
    """

    def __init__(self, bounds: Sequence[float], now: float) -> None:
        self.bounds = list(bounds)
        self.at = now
        self.totals = (0, 0, 0)
        self.counts = [0] * (len(bounds) + 1)

    def log(self, log: Any, stats: Any, counts: Sequence[int], now: float) -> None:
        """Log ``summary`` at info with :meth:`fields` of ``stats`` (the consumer's
        ``finished``, ``requeued``, ``given_up``), unless nothing was handled."""
        fields = self.fields(stats.finished, stats.requeued, stats.given_up, counts, now)
        if fields is not None:
            log.info("summary", **fields)

    def fields(
        self, finished: int, requeued: int, dead: int, counts: Sequence[int], now: float
    ) -> dict[str, Any] | None:
        """Counts, rate (messages/s) and p50/p99 handler duration (ms) since last time."""
        fin, req, dlq = (
            a - b for a, b in zip((finished, requeued, dead), self.totals, strict=True)
        )
        window = [a - b for a, b in zip(counts, self.counts, strict=True)]
        elapsed, self.at = now - self.at, now
        self.totals, self.counts = (finished, requeued, dead), list(counts)
        handled = fin + req + dlq
        if not handled:
            return None
        return {
            "finished": fin,
            "retried": req,
            "dead_letter": dlq,
            "rate": round(handled / elapsed, 1) if elapsed > 0 else 0.0,
            "p50_ms": round(histogram_quantile(self.bounds, window, 0.5) * 1000, 3),
            "p99_ms": round(histogram_quantile(self.bounds, window, 0.99) * 1000, 3),
            "seconds": round(elapsed, 1),
        }


async def every(interval: float, call: Callable[[], object]) -> None:
    """``call()`` every ``interval`` seconds until cancelled (the summary lines)."""
    while True:
        await asyncio.sleep(interval)
        call()
