"""JetStream names and set-up: subjects, consumer names, the stream a subject lives in,
and the durable pull consumer of a channel.

A topic is a subject without wildcards. Its messages live in the stream whose subjects
cover it (found by asking the server), else in a stream the worker creates, named from
the subject (``orders.created`` -> ``orders_created``), or in the stream the settings name.
A channel is a durable pull consumer of that stream, filtered to the subject.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from nsqworker.errors import ConfigurationError, InvalidName

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from nsqworker.settings import Settings

__all__ = [
    "ack_wait",
    "check_channel",
    "check_subject",
    "consumer_name",
    "delay_pattern",
    "ensure_consumer",
    "ensure_schedules",
    "ensure_stream",
    "stream_name",
]

_TOKEN = re.compile(r"^[^\s*>.]+$")
_NAME = re.compile(r"^[^\s*>./\\]{1,255}$")
# JetStream API error codes (ApiError.err_code) the set-up turns into clear errors.
_STREAM_NOT_FOUND = 10059
_SUBJECTS_OVERLAP = 10065
_NAME_IN_USE = 10058
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
    subjects cover it, or a new one (limits from the settings). ``ConfigurationError``
    names the stream and subject when none can be used."""
    from nats.js.api import RetentionPolicy, StreamConfig
    from nats.js.errors import APIError, NotFoundError

    name = settings.nats_stream
    if name is None:
        try:
            return await js.find_stream_name_by_subject(subject)
        except NotFoundError:
            name = stream_name(subject)
    else:
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            pass
        else:
            if not _covers(info.config.subjects or [], subject):
                raise ConfigurationError(
                    f"nats_stream {name!r} does not hold subject {subject!r} (its subjects:"
                    f" {', '.join(info.config.subjects or [])}); add it to the stream or"
                    " unset nats_stream"
                )
            return name
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
    return name


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
) -> None:
    """Create or update the channel's durable pull consumer on ``stream``.

    Explicit acks; ``max_deliver`` unlimited (the task layer dead-letters on its last
    attempt, the server would only stop delivering); ``ack_wait`` from ``msg_timeout``.
    """
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import APIError

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


def ack_wait(settings: Settings) -> float:
    """Seconds before JetStream redelivers an unacked message: ``msg_timeout`` or 30."""
    return float(settings.msg_timeout or 30.0)
