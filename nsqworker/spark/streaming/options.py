"""The options every broker source and sink reads, checked once with a clear error.

Spark hands a source or sink every option a query sets, and a data source that reads
only the names it knows would ignore a misspelt one (``maxRecordPerBatch``: no cap,
silently). So each source and sink refuses, when Spark creates its reader or writer
(the query's start), an option it does not read, naming the closest one it does; the
options Spark itself adds (:data:`SPARK_OPTIONS`) pass.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from nsqworker.errors import ConfigurationError

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = [
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "SPARK_OPTIONS",
    "SourceOptions",
    "check_sink_options",
    "load_settings",
    "refuse_unknown",
]

SPARK_OPTIONS: Final = ("path", "paths", "checkpointLocation", "queryName")
"""Options Spark adds itself (``load(path)``, ``start(path)``, the writer's
``checkpointLocation`` and ``queryName``): never refused, never read."""
SOURCE_OPTIONS: Final = ("startingOffsets", "maxRecordsPerBatch", "numPartitions")
"""The options every source reads besides where to read from (its ``topic_keys``)."""
_SOURCE_OWN: Final[Mapping[str, tuple[str, ...]]] = {"nsq": ("channel", "maxInFlight")}
SINK_OPTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "rabbitmq-stream": ("stream", "topic", "producerName"),
    "nats": ("subject", "producerName"),
    "nsq": ("topic", "producerName"),
}
"""The options each format's sink reads."""

#: Options that would carry a credential: refused, since Spark shows a query's options
#: in its plans and UI. Credentials come from the environment (``NSQWORKER_*``).
_SECRET_WORDS = ("password", "secret", "token", "uri", "seed", "auth")


@dataclass(frozen=True)
class SourceOptions:
    """``topic`` (or ``stream``/``subject``), ``startingOffsets`` (``earliest``,
    ``latest`` or a number), ``maxRecordsPerBatch`` (0: no cap) and ``numPartitions``."""

    topic: str
    starting: str | int
    max_per_batch: int
    partitions: int

    @classmethod
    def parse(
        cls, options: Mapping[str, str], format: str, topic_keys: tuple[str, ...]
    ) -> SourceOptions:
        """Read ``options``; raises ConfigurationError naming the option that is wrong,
        or one the ``format`` source does not read."""
        refuse_secrets(options, format)
        known = (*topic_keys, *SOURCE_OPTIONS, *_SOURCE_OWN.get(format, ()))
        refuse_unknown(options, known, f"{format} source")
        options = {k.lower(): str(v) for k, v in options.items()}
        topic = next((options[k.lower()] for k in topic_keys if options.get(k.lower())), "")
        if not topic:
            raise ConfigurationError(f"{format}: set the option {topic_keys[0]!r}")
        starting_text = options.get("startingoffsets", "earliest").strip().lower()
        starting: str | int
        if starting_text in ("earliest", "latest"):
            starting = starting_text
        else:
            starting = _count("startingOffsets", format, starting_text)
        max_per_batch = _count("maxRecordsPerBatch", format, options.get("maxrecordsperbatch", "0"))
        partitions = _count("numPartitions", format, options.get("numpartitions", "2"))
        if partitions < 1:
            raise ConfigurationError(
                f"{format}: numPartitions must be at least 1; got {partitions}"
            )
        return cls(topic, starting, max_per_batch, partitions)


def _count(name: str, format: str, text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigurationError(
            f"{format}: option {name} must be a whole number; got {text!r}"
        ) from None
    if value < 0:
        raise ConfigurationError(f"{format}: option {name} must not be negative; got {value}")
    return value


def refuse_secrets(options: Mapping[str, str], format: str) -> None:
    """Raise when an option's name says it holds a credential."""
    for name in options:
        if any(word in name.lower() for word in _SECRET_WORDS):
            raise ConfigurationError(
                f"{format}: option {name!r} would carry a credential, and Spark shows a "
                "query's options in its plans and UI; set it in the environment instead "
                "(NSQWORKER_RABBITMQ_STREAM_URI, NSQWORKER_NATS_PASSWORD, ...)"
            )


def refuse_unknown(options: Iterable[str], known: Iterable[str], where: str) -> None:
    """Raise ConfigurationError on the first option (any case: Spark passes them in
    lower case) that is neither in ``known`` nor one of :data:`SPARK_OPTIONS`, naming
    the closest known one; ``where`` says whose option (``nats source``)."""
    read = tuple(dict.fromkeys(known))
    names = {k.lower(): k for k in (*read, *SPARK_OPTIONS)}
    for name in options:
        if name.lower() in names:
            continue
        close = difflib.get_close_matches(name.lower(), list(names), n=1)
        hint = f"; did you mean {names[close[0]]!r}? It" if close else "; it"
        raise ConfigurationError(f"{where}: unknown option {name!r}{hint} reads {', '.join(read)}")


def check_sink_options(options: Mapping[str, str], format: str) -> None:
    """Raise ConfigurationError when ``options`` of the ``format`` sink would carry a
    credential or has an option the sink does not read."""
    refuse_secrets(options, format)
    refuse_unknown(options, SINK_OPTIONS[format], f"{format} sink")


def load_settings() -> Settings:
    """The worker's :class:`~nsqworker.settings.Settings`, from the environment and the
    settings file, as ``nsqworker run`` reads them."""
    from nsqworker.settings import Settings

    return Settings()
