"""The options every broker source and sink reads, checked once with a clear error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsqworker.errors import ConfigurationError

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["SourceOptions", "load_settings"]

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
        """Read ``options``; raises ConfigurationError naming the option that is wrong."""
        refuse_secrets(options, format)
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


def load_settings() -> Settings:
    """The worker's :class:`~nsqworker.settings.Settings`, from the environment and the
    settings file, as ``nsqworker run`` reads them."""
    from nsqworker.settings import Settings

    return Settings()
