"""JetStream names and set-up: subjects, consumer names, the stream a subject lives in,
and the durable pull consumer of a channel.

A topic is a subject without wildcards. Its messages live in the stream whose subjects
cover it (found by asking the server), else in a stream the worker creates, named from
the subject (``orders.created`` -> ``orders_created``), or in the stream the settings name.
A channel is a durable pull consumer of that stream, filtered to the subject.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from nsqworker.errors import ConfigurationError, InvalidName

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import ConsumerConfig

    from nsqworker.settings.nats import NatsSettings as Settings

__all__ = [
    "ack_wait",
    "check_channel",
    "check_subject",
    "consumer_name",
    "delay_pattern",
    "ensure_consumer",
    "ensure_schedules",
    "ensure_stream",
    "jetstream_off",
    "stream_name",
]

log = logging.getLogger("nsqworker.nats")

_TOKEN = re.compile(r"^[^\s*>.]+$")
_NAME = re.compile(r"^[^\s*>./\\]{1,255}$")
# JetStream API error codes (ApiError.err_code) the set-up turns into clear errors.
_STREAM_NOT_FOUND = 10059
_SUBJECTS_OVERLAP = 10065
_NAME_IN_USE = 10058
_NOT_ENABLED_FOR_ACCOUNT = 10039
DELAY_TOKEN = "_nsqw_delay"
"""Delayed messages wait as schedules on ``<subject>._nsqw_delay.<id>`` (one each) until
the server publishes them to the subject (JetStream message schedules, nats-server 2.12+)."""


def check_subject(subject: str) -> str:
    """A NATS subject to publish to: dot-separated tokens, no wildcards, no spaces."""
    if not isinstance(subject, str) or not subject:
        raise InvalidName(f"topic {subject!r}: a NATS subject must not be empty")
    if len(subject) > 255 or not all(_TOKEN.match(t) for t in subject.split(".")):
        raise InvalidName(
            f"topic {subject!r} is not a NATS subject to consume: use dot-separated tokens"
            " without spaces or the wildcards * and >, like orders.created"
        )
    return subject


def check_channel(channel: str) -> str:
    """A durable consumer name: no spaces, dots, wildcards or path separators."""
    if not isinstance(channel, str) or not _NAME.match(channel):
        raise InvalidName(
            f"channel {channel!r} is not a JetStream consumer name: 1-255 characters"
            " without spaces, '.', '*', '>', '/' or '\\'"
        )
    return channel


def delay_pattern(subject: str) -> str:
    """The subjects of ``subject``'s delayed messages (schedules)."""
    return f"{subject}.{DELAY_TOKEN}.*"


def stream_name(subject: str) -> str:
    """The name of the stream a worker creates for ``subject``."""
    return subject.replace(".", "_")


async def ensure_stream(js: JetStreamContext, subject: str, settings: Settings) -> str:
    """The stream holding ``subject``: the settings' ``nats_stream``, or the one whose
    subjects cover it, or a new one (limits from the settings; not with ``nats_create``
    off). A stream found is used as it is (its retention, limits and other subjects are
    the operator's). ``ConfigurationError`` names the stream and subject when none can be
    used, and says so when the server has no JetStream."""
    from nats.errors import NoRespondersError
    from nats.js.api import RetentionPolicy, StreamConfig
    from nats.js.errors import APIError, ServiceUnavailableError

    try:
        found = await _find_stream(js, subject, settings)
    except (NoRespondersError, ServiceUnavailableError, APIError) as exc:
        if (off := jetstream_off(exc, settings)) is not None:
            raise off from None
        raise
    if isinstance(found, str):
        return found
    name = found.name
    if not settings.nats_create:
        missing = (
            f"stream {name!r} (nats_stream) does not exist"
            if settings.nats_stream
            else f"no JetStream stream holds subject {subject!r}"
        )
        raise ConfigurationError(
            f"{missing}, and nats_create is off: create a stream for {subject!r} (or name"
            " one in nats_stream), or turn nats_create on"
        )

    config = StreamConfig(
        name=name,
        subjects=[subject, delay_pattern(subject)],
        allow_msg_schedules=True,
        retention=RetentionPolicy(settings.nats_stream_retention),
        max_age=settings.nats_stream_max_age or None,
        num_replicas=settings.nats_stream_replicas,
    )
    try:
        await js.add_stream(config)
    except APIError as exc:
        if exc.err_code == _SUBJECTS_OVERLAP:
            raise ConfigurationError(
                f"cannot create stream {name!r} for subject {subject!r}: its subjects"
                f" overlap another stream's ({exc.description}); name that stream in"
                " nats_stream, or use a subject no stream covers"
            ) from None
        if exc.err_code == _NAME_IN_USE:
            raise ConfigurationError(
                f"stream {name!r} exists with other subjects than {subject!r}; set nats_stream"
                " to a stream that holds the subject"
            ) from None
        raise ConfigurationError(
            f"cannot create stream {name!r} for subject {subject!r}: {exc.description}"
            f" (JetStream error {exc.err_code})"
        ) from None
    log.info("created stream %r for subject %r", name, subject)
    return name


class _Missing:
    """No stream holds the subject: one named ``name`` is to be created."""

    def __init__(self, name: str) -> None:
        self.name = name


async def _find_stream(js: JetStreamContext, subject: str, settings: Settings) -> str | _Missing:
    from nats.js.errors import NotFoundError

    name = settings.nats_stream
    if name is None:
        try:
            return await js.find_stream_name_by_subject(subject)
        except NotFoundError:
            return _Missing(stream_name(subject))
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        return _Missing(name)
    if not _covers(info.config.subjects or [], subject):
        raise ConfigurationError(
            f"nats_stream {name!r} does not hold subject {subject!r} (its subjects:"
            f" {', '.join(info.config.subjects or [])}); add it to the stream or"
            " unset nats_stream"
        )
    return name


def jetstream_off(exc: BaseException, settings: Settings) -> ConfigurationError | None:
    """A ``ConfigurationError`` saying JetStream is off when ``exc`` says so (nobody
    answers the JetStream API: a 503 without an error code, or no responders; or the
    account has no JetStream), else None."""
    from nats.errors import NoRespondersError
    from nats.js.errors import APIError, ServiceUnavailableError

    where = ", ".join(settings.nats_servers) or "nats://127.0.0.1:4222"
    if isinstance(exc, NoRespondersError) or (
        isinstance(exc, ServiceUnavailableError) and exc.err_code is None
    ):
        return ConfigurationError(
            f"JetStream is not enabled on the NATS server at {where}: start nats-server"
            " with -js (--jetstream), or add `jetstream {}` to its configuration file"
        )
    if isinstance(exc, APIError) and exc.err_code == _NOT_ENABLED_FOR_ACCOUNT:
        return ConfigurationError(
            f"JetStream is not enabled for this account on the NATS server at {where}"
            f" ({exc.description}): give the account `jetstream: enabled` in the server's"
            " configuration"
        )
    return None


async def consumer_name(js: JetStreamContext, stream: str, subject: str, channel: str) -> str:
    """The channel's durable name: the channel itself in a stream of this subject alone;
    ``<channel>_<subject>`` in a shared stream, where one channel may read many subjects."""
    info = await js.stream_info(stream)
    if set(info.config.subjects or []) <= {subject, delay_pattern(subject)}:
        return channel
    return f"{channel}_{stream_name(subject)}"


async def ensure_schedules(js: JetStreamContext, stream: str, subject: str) -> None:
    """Make ``stream`` hold schedules for ``subject`` (a delayed publish): a stream the
    worker made for the subject is updated; any other must allow them already."""
    info = await js.stream_info(stream)
    config = info.config
    subjects = list(config.subjects or [])
    pattern = delay_pattern(subject)
    if config.allow_msg_schedules and _covers(subjects, f"{subject}.{DELAY_TOKEN}.x"):
        return
    if stream == stream_name(subject) and set(subjects) <= {subject, pattern}:
        config.subjects = [subject, pattern]
        config.allow_msg_schedules = True
        await js.update_stream(config)
        return
    raise ConfigurationError(
        f"stream {stream!r} cannot hold a delayed message for {subject!r}: it needs"
        f" allow_msg_schedules and the subjects {pattern!r} (nats-server 2.12+);"
        " change the stream, or publish without a delay"
    )


def _covers(patterns: list[str], subject: str) -> bool:
    tokens = subject.split(".")
    for pattern in patterns:
        parts = pattern.split(".")
        for i, part in enumerate(parts):
            if part == ">":
                if len(tokens) > i:
                    return True
                break
            if i >= len(tokens) or (part != "*" and part != tokens[i]):
                break
        else:
            if len(parts) == len(tokens):
                return True
    return False


async def ensure_consumer(
    js: JetStreamContext, stream: str, subject: str, durable: str, settings: Settings
) -> float:
    """The channel's durable pull consumer on ``stream``: one that exists is used as it
    is (differences from the worker's settings logged once, at info); a missing one is
    created (not with ``nats_create`` off). Returns the consumer's ``ack_wait`` (seconds).

    A consumer the worker creates has explicit acks, ``max_deliver`` unlimited (the task
    layer dead-letters on its last attempt, the server would only stop delivering) and
    ``ack_wait`` from ``msg_timeout``. One that cannot serve a channel (a push consumer,
    acks other than explicit, a filter that misses the subject or takes others) is a
    ``ConfigurationError`` saying what to change.
    """
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import APIError, NotFoundError

    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        info = None
    if info is not None:
        _check_usable(info.config, stream, subject, durable)
        _log_differences(info.config, stream, durable, settings)
        return float(info.config.ack_wait or ack_wait(settings))
    if not settings.nats_create:
        raise ConfigurationError(
            f"consumer {durable!r} does not exist on stream {stream!r}, and nats_create is"
            " off: create it (a durable pull consumer with explicit acks), or turn"
            " nats_create on"
        )
    config = ConsumerConfig(
        durable_name=durable,
        filter_subject=subject,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=ack_wait(settings),
        max_deliver=-1,
        max_ack_pending=settings.nats_max_ack_pending,
        max_waiting=512,
    )
    try:
        await js.add_consumer(stream, config)
    except APIError as exc:
        raise ConfigurationError(
            f"cannot create consumer {durable!r} on stream {stream!r} for {subject!r}:"
            f" {exc.description} (JetStream error {exc.err_code})"
        ) from None
    return ack_wait(settings)


def _check_usable(config: ConsumerConfig, stream: str, subject: str, durable: str) -> None:
    from nats.js.api import AckPolicy

    where = f"consumer {durable!r} of stream {stream!r}"
    problem = None
    if config.deliver_subject:
        problem = f"is a push consumer (deliver_subject {config.deliver_subject!r})"
    elif config.ack_policy not in (None, AckPolicy.EXPLICIT):
        problem = f"acknowledges with ack_policy {config.ack_policy}, not explicit"
    else:
        filters = list(config.filter_subjects or [])
        if config.filter_subject:
            filters.append(config.filter_subject)
        if filters and not _covers(filters, subject):
            problem = f"filters on {', '.join(filters)}, which does not take {subject!r}"
        elif filters and set(filters) - {subject}:
            problem = f"filters on {', '.join(filters)}: other subjects than {subject!r} too"
    if problem is not None:
        raise ConfigurationError(
            f"{where} {problem}: a channel needs a durable pull consumer with explicit acks"
            f" filtered to {subject!r}; change or delete the consumer, or use another channel"
        )


_logged: set[tuple[str, str]] = set()


def _log_differences(config: ConsumerConfig, stream: str, durable: str, settings: Settings) -> None:
    """Log once (per process) where an existing consumer differs from what the worker
    would create."""
    if (stream, durable) in _logged:
        return
    wanted = {
        "ack_wait": ack_wait(settings),
        "max_deliver": -1,
        "max_ack_pending": settings.nats_max_ack_pending,
    }
    differ = []
    for key, ours in wanted.items():
        theirs = getattr(config, key, None)
        if theirs is not None and theirs != ours:
            differ.append(f"{key}={theirs:g} (the worker's: {ours:g})")
    if differ:
        _logged.add((stream, durable))
        log.info(
            "consumer %r of stream %r exists with %s; using it as it is (update or delete"
            " it to apply the worker's)", durable, stream, ", ".join(differ),
        )  # fmt: skip


def ack_wait(settings: Settings) -> float:
    """Seconds before JetStream redelivers an unacked message: ``msg_timeout`` or 30."""
    return float(settings.msg_timeout or 30.0)
