"""Dead letters you can list, replay and purge, the same on every transport.

A task with a ``dead_letter_topic`` publishes there an envelope of each message it gave
up on (:mod:`nsqworker.dead_letters`). These functions read that topic without settling
anything (:mod:`nsqworker.admin.stores` and one store per broker), turn each message into
a :class:`DeadLetter` (foreign or hostile messages included, with the ``problem`` that
keeps them from being replayed), publish original bodies back, and remove dead letters
only once what replaced them was acknowledged by the broker.

Every function opens its own connections and closes them before it returns; the settings
choose the broker (``settings.transport``) exactly as for ``nsqworker run``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nsqworker.admin.envelopes import preview, read_envelope
from nsqworker.admin.stores import QUIET, Store, Stored
from nsqworker.errors import ConfigurationError, MessageTooLarge, NSQWorkerError, PublishError

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = [
    "RESERVED_PREFIXES",
    "DeadLetter",
    "PurgeReport",
    "ReplayReport",
    "check_destination",
    "list_dead_letters",
    "open_store",
    "purge_dead_letters",
    "replay_dead_letters",
    "replay_plan",
    "replay_sources",
]

log = logging.getLogger("nsqworker.admin")

NOT_FOUND = "no such dead letter"
RESERVED_PREFIXES = ("$", "_INBOX")
"""Names a replay never publishes to, on any transport: NATS's system and API subjects
(``$JS.API.STREAM.DELETE.X`` deletes a stream) and its reply inboxes."""


@dataclass(frozen=True)
class DeadLetter:
    """One message of a dead-letter topic, as the tools show it.

    ``id`` is stable across listings and is what ``--id`` takes (nsqd's message id, a
    JetStream sequence, a stream offset). ``task``, ``topic`` (the original topic),
    ``attempts`` and ``reason`` come from the envelope (None for a foreign message);
    ``rejected_at`` is when the broker took the dead letter. ``body`` is the original
    body when it can be recovered whole; ``problem`` says why it cannot be replayed
    (None when it can).
    """

    id: str
    task: str | None
    topic: str | None
    attempts: int | None
    reason: str | None
    rejected_at: datetime | None
    body_preview: str
    body: bytes | None
    problem: str | None
    envelope: dict[str, Any] | None

    @property
    def replayable(self) -> bool:
        """True when the original body can be published again."""
        return self.problem is None and self.body is not None and self.topic is not None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the body as base64 under ``body_base64``)."""
        import base64

        return {
            "id": self.id,
            "task": self.task,
            "topic": self.topic,
            "attempts": self.attempts,
            "reason": self.reason,
            "rejected_at": None if self.rejected_at is None else self.rejected_at.isoformat(),
            "body_preview": self.body_preview,
            "body_base64": None if self.body is None else base64.b64encode(self.body).decode(),
            "problem": self.problem,
            "replayable": self.replayable,
        }


@dataclass
class ReplayReport:
    """What a replay did: ``replayed`` (published and removed, or with ``dry_run``, would
    be), ``refused`` (id -> why it is not replayed: a problem, a destination that is not
    allowed, or no such dead letter), ``left`` (replayable but still there: the publish
    or the removal failed, see ``errors``), ``destinations`` (where the replayed ones went,
    or would go: topic -> how many)."""

    replayed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)
    destinations: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """``replayed 3 (3 to orders), refused 1, left 0`` (``would replay`` on a dry run)."""
        verb = "would replay" if self.dry_run else "replayed"
        where = ", ".join(f"{n} to {topic}" for topic, n in sorted(self.destinations.items()))
        shown = f" ({where})" if where else ""
        return (
            f"{verb} {len(self.replayed)}{shown}, refused {len(self.refused)},"
            f" left {len(self.left)}"
        )


@dataclass
class PurgeReport:
    """What a purge did: ``purged`` (removed) and ``left`` (chosen, not removed: see
    ``errors``; an id that matches no dead letter is left with that error)."""

    purged: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """``purged 3, left 0``."""
        return f"purged {len(self.purged)}, left {len(self.left)}"


def open_store(settings: Settings, topic: str, *, quiet: float = QUIET) -> Store:
    """The store of ``topic`` on the broker ``settings.transport`` names."""
    name = settings.transport
    if name == "nsq":
        from nsqworker.admin.nsq_store import NsqStore

        return NsqStore(settings, topic, quiet=quiet)
    if name == "nats":
        from nsqworker.admin.nats_store import NatsStore

        return NatsStore(settings, topic)
    if name == "rabbitmq-stream":
        from nsqworker.admin.streams_store import StreamStore

        return StreamStore(settings, topic, quiet=quiet)
    raise ConfigurationError(
        f"dead letters cannot be read on transport {name!r}: use nsq, nats or rabbitmq-stream"
    )


def _checker(settings: Settings) -> Callable[[str], object]:
    from nsqworker.transport import create_transport

    return create_transport(settings).check_topic


def to_dead_letter(item: Stored, check_topic: Callable[[str], object] | None) -> DeadLetter:
    """The :class:`DeadLetter` of one stored message (never raises)."""
    reading = read_envelope(item.data, check_topic)
    env = reading.envelope or {}
    attempts = env.get("attempts")
    return DeadLetter(
        id=item.id,
        task=_text(env.get("task")),
        topic=_text(env.get("topic")),
        attempts=attempts if type(attempts) is int else None,
        reason=_text(env.get("reason")),
        rejected_at=item.stored_at,
        body_preview=preview(reading.shown),
        body=reading.body,
        problem=reading.problem,
        envelope=reading.envelope,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


async def list_dead_letters(
    settings: Settings,
    topic: str,
    *,
    limit: int | None = None,
    quiet: float = QUIET,
    on_note: Callable[[str], None] | None = None,
) -> list[DeadLetter]:
    """The dead letters on ``topic``, oldest first (the first ``limit``). Nothing is
    removed, settled or reordered: listing twice gives the same answer.

    ``quiet``: on NSQ and RabbitMQ Streams, seconds without a new message after which
    the read is complete. ``on_note`` gets what the reader should know (on NSQ, that
    nsqd may hold more than one client can take at once). Raises ``ConfigurationError`` for a bad topic or settings and
    ``NoConnection`` when the broker cannot be reached.
    """
    if limit is not None and limit < 0:
        raise ConfigurationError(f"limit must be >= 0, got {limit}")
    check = _checker(settings)
    async with open_store(settings, topic, quiet=quiet) as store:
        items = await store.read(limit)
    if on_note is not None:
        for note in store.notes:
            on_note(note)
    return [to_dead_letter(item, check) for item in items]


def replay_sources(tasks: Iterable[Any], dead_letter_topic: str) -> frozenset[str]:
    """The topics whose tasks dead-letter to ``dead_letter_topic``: where its dead
    letters may be replayed. ``tasks``: a :class:`~nsqworker.Registry`'s task specs, or
    anything with ``topic`` and ``dead_letter_topic`` (the console's rows of the workers'
    reported tasks)."""
    return frozenset(
        t.topic for t in tasks
        if getattr(t, "dead_letter_topic", None) == dead_letter_topic and t.topic
    )  # fmt: skip


def check_destination(
    settings: Settings, name: str, check: Callable[[str], object] | None = None
) -> str:
    """``name`` if a replay may publish there: the transport's name rules (``check``, or
    the settings' transport's), and never a reserved name (:data:`RESERVED_PREFIXES`);
    else ``ConfigurationError`` saying why."""
    if not isinstance(name, str) or name.startswith(RESERVED_PREFIXES):
        raise ConfigurationError(
            f"{name!r} is a reserved name (starting with $ or _INBOX): a replay never"
            " publishes there"
        )
    try:
        (check or _checker(settings))(name)
    except NSQWorkerError as exc:
        raise ConfigurationError(f"{name!r} cannot be a replay's destination: {exc}") from None
    return name


async def replay_dead_letters(
    settings: Settings,
    topic: str,
    *,
    ids: Collection[str] | None = None,
    to: str | None = None,
    sources: Collection[str] | None = None,
    dry_run: bool = False,
    quiet: float = QUIET,
    on_replayed: Callable[[DeadLetter], None] | None = None,
) -> ReplayReport:
    """Publish the original body of each chosen dead letter (``ids``, each a dead
    letter's id or its original message's, as :func:`pick` reads them; None: all) to its
    original topic, or to ``to``, oldest first; remove each dead letter only after the
    broker acknowledged its publish. A replayed message is a new message: its attempts
    start again.

    A dead letter goes back to its original topic only when that topic is in
    ``sources``: the topics of the tasks that dead-letter to ``topic``
    (:func:`replay_sources` of the tasks module, or of the workers' reported tasks), so
    a crafted envelope cannot choose where the operator publishes. ``to`` is the
    operator's own choice and replaces them. Neither given: ``ConfigurationError``.
    Reserved names (``$...``, ``_INBOX...``) are refused even as ``to``.

    Refused (never published): foreign or hostile messages, truncated bodies, topics
    that are not allowed, unknown ids. With ``dry_run`` nothing is published or
    removed, and ``destinations`` says where each would go. On NATS and RabbitMQ
    Streams each publish carries a de-duplication id derived from the dead letter, so a
    replay run again after a crash, or two at once, store each dead letter once (NATS:
    within the stream's duplicate window). ``on_replayed`` is called after each dead
    letter is replayed.

    A failure to reach the broker stops the replay (the rest are ``left``); a message
    the broker refuses is left with the broker's reason and the replay goes on.
    """
    check = _checker(settings)
    if to is not None:
        check_destination(settings, to, check)
    elif sources is None:
        raise ConfigurationError(
            f"a replay goes only where the messages of {topic} came from, and no task that"
            " dead-letters there is known: name the tasks module (--tasks myservice.tasks),"
            " or the destination (--to TOPIC)"
        )
    allowed = frozenset(sources or ())
    report = ReplayReport(dry_run=dry_run)
    where: Counter[str] = Counter()
    async with open_store(settings, topic, quiet=quiet) as store:
        chosen = _choose(await store.read(), ids, report.refused, check)
        stopped: str | None = None
        for item, letter in chosen:
            target = to or letter.topic
            refusal = _refusal(settings, check, topic, letter, target, to is None, allowed)
            if refusal is not None:
                report.refused[letter.id] = refusal
            elif stopped is not None:
                report.left.append(letter.id)
                report.errors[letter.id] = stopped
            elif dry_run:
                report.replayed.append(letter.id)
                where[str(target)] += 1
            else:
                stopped = await _replay_one(store, item, letter, str(target), report)
                if report.replayed[-1:] == [letter.id]:
                    where[str(target)] += 1
                    if on_replayed is not None:
                        on_replayed(letter)
    for letter_id, why in store.failed_removals.items():
        if letter_id in report.replayed:
            report.replayed.remove(letter_id)
            report.left.append(letter_id)
            report.errors[letter_id] = (
                f"published but not removed ({why}): a second replay would publish it again"
            )
    report.destinations = dict(where)
    report.notes.extend(store.notes)
    return report


def replay_plan(
    settings: Settings,
    topic: str,
    letters: Iterable[DeadLetter],
    sources: Collection[str],
    to: str | None = None,
) -> ReplayReport:
    """Where a replay of ``letters`` (already read) would send each, with no broker
    asked: a dry run's report (the console shows it before "Replay all")."""
    check = _checker(settings)
    report = ReplayReport(dry_run=True)
    where: Counter[str] = Counter()
    allowed = frozenset(sources)
    for letter in letters:
        target = to or letter.topic
        refusal = _refusal(settings, check, topic, letter, target, to is None, allowed)
        if refusal is None:
            report.replayed.append(letter.id)
            where[str(target)] += 1
        else:
            report.refused[letter.id] = refusal
    report.destinations = dict(where)
    return report


def _refusal(
    settings: Settings,
    check: Callable[[str], object],
    topic: str,
    letter: DeadLetter,
    target: str | None,
    original: bool,
    allowed: frozenset[str],
) -> str | None:
    """Why ``letter`` is not replayed to ``target``, or None when it may be."""
    if letter.problem is not None or letter.body is None or target is None:
        return letter.problem or "no original body"
    if original and target not in allowed:
        known = ", ".join(sorted(allowed)) or "none"
        return (
            f"its topic {target!r} is not one whose task dead-letters to {topic}"
            f" (those: {known}); name a destination with --to if you mean it"
        )
    try:
        check_destination(settings, target, check)
    except ConfigurationError as exc:
        return str(exc)
    return None


def _choose(
    items: list[Stored],
    ids: Collection[str] | None,
    refused: dict[str, str],
    check: Callable[[str], object],
) -> list[tuple[Stored, DeadLetter]]:
    """The stored dead letters ``ids`` names (all when None), oldest first; unknown
    ids go to ``refused``."""
    chosen = [(item, to_dead_letter(item, check)) for item in items]
    if ids is None:
        return chosen
    picked, missing = pick(chosen, ids)
    for letter_id in missing:
        refused[letter_id] = NOT_FOUND
    return picked


def pick(
    letters: list[tuple[Stored, DeadLetter]], ids: Collection[str]
) -> tuple[list[tuple[Stored, DeadLetter]], list[str]]:
    """The dead letters an id names, oldest first, and the ids that name none. An id
    is the dead letter's own (what ``list`` shows) or the original message's, which the
    worker's ``dead-letter`` log line shows (the envelope's ``id``: every dead letter of
    that message)."""
    wanted = set(ids)
    found: set[str] = set()
    picked = []
    for item, letter in letters:
        original = (letter.envelope or {}).get("id")
        hits = wanted & {item.id, original if isinstance(original, str) else item.id}
        if hits:
            found |= hits
            picked.append((item, letter))
    return picked, sorted(wanted - found)


async def _replay_one(
    store: Store, item: Stored, letter: DeadLetter, target: str, report: ReplayReport
) -> str | None:
    """Publish, then remove; None, or why the replay must stop (the broker is gone)."""
    assert letter.body is not None
    try:
        await store.publish(item, target, letter.body)
    except (PublishError, MessageTooLarge) as exc:  # about this message: go on
        report.left.append(letter.id)
        report.errors[letter.id] = f"not published to {target}: {_one_line(exc)}"
        return None
    except (NSQWorkerError, OSError, TimeoutError) as exc:
        report.left.append(letter.id)
        report.errors[letter.id] = f"not published to {target}: {_one_line(exc)}"
        return f"not tried: the replay stopped ({_one_line(exc)})"
    try:
        await store.remove(item)
    except Exception as exc:
        report.left.append(letter.id)
        report.errors[letter.id] = (
            f"published to {target} but not removed ({_one_line(exc)}): a second replay"
            " would publish it again"
        )
        return f"not tried: the replay stopped ({_one_line(exc)})"
    report.replayed.append(letter.id)
    return None


async def purge_dead_letters(
    settings: Settings,
    topic: str,
    *,
    ids: Collection[str] | None = None,
    older_than: float | None = None,
    quiet: float = QUIET,
) -> PurgeReport:
    """Remove dead letters for good: those ``ids`` names (as :func:`pick` reads them),
    or those rejected more than ``older_than`` seconds ago, or (neither given) all.
    Foreign messages are removed like any other; a dead letter with no known time never
    matches ``older_than``."""
    if older_than is not None and not older_than >= 0:
        raise ConfigurationError(f"older_than must be seconds >= 0, got {older_than!r}")
    report = PurgeReport()
    async with open_store(settings, topic, quiet=quiet) as store:
        items = await store.read()
        if ids is not None:
            picked, missing = pick([(i, to_dead_letter(i, None)) for i in items], ids)
            for letter_id in missing:
                report.left.append(letter_id)
                report.errors[letter_id] = NOT_FOUND
            items = [item for item, _ in picked]
        if older_than is not None:
            cutoff = time.time() - older_than
            items = [
                item for item in items
                if item.stored_at is not None and item.stored_at.timestamp() < cutoff
            ]  # fmt: skip
        for item in items:
            try:
                await store.remove(item)
            except Exception as exc:
                report.left.append(item.id)
                report.errors[item.id] = f"not removed: {_one_line(exc)}"
            else:
                report.purged.append(item.id)
    for letter_id, why in store.failed_removals.items():
        if letter_id in report.purged:
            report.purged.remove(letter_id)
            report.left.append(letter_id)
            report.errors[letter_id] = f"not removed: {why}"
    report.notes.extend(store.notes)
    return report


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
