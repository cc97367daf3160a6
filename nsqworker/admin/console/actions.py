"""The console's dead-letter work, done by :mod:`nsqworker.admin.dead_letters` (the same
library as ``nsqworker dead-letters``): list, and the two actions, replay and purge.

An action names its topic and either ``"all": true`` or the ``ids`` to act on, so a
request can never mean "all" by leaving something out. The console reads and acts only
on the dead-letter topics its workers' tasks declare or ``console_dead_letter_topics``
names, and a replay goes back only to the topics of the tasks that dead-letter there.
At most :data:`MAX_LISTINGS` listings run at once; a page view beyond them waits.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsqworker.admin.dead_letters import DeadLetter
    from nsqworker.settings import Settings

__all__ = ["LIST_LIMIT", "MAX_LISTINGS", "BadOrder", "Order", "list_letters", "perform"]

#: Dead letters a page lists at most (oldest first).
LIST_LIMIT = 500
#: Seconds a listing may take before the page says so.
LIST_TIMEOUT = 30.0
MAX_IDS = 10_000
MAX_NAME = 255
#: Listings the console runs at once (each holds broker connections and up to
#: LIST_LIMIT messages); others wait for a turn, within LIST_TIMEOUT.
MAX_LISTINGS = 2


class _Listings:
    """One loop's listings: at most :data:`MAX_LISTINGS` at once, and one per topic,
    shared by every page view that asks while it runs (on NSQ a read takes the messages
    into flight, so two reads of one topic at once would each see only part of it)."""

    def __init__(self) -> None:
        self.turns = asyncio.Semaphore(MAX_LISTINGS)
        self.running: dict[str, asyncio.Future[tuple[list[Any], list[str]]]] = {}

    async def read(self, settings: Settings, topic: str) -> tuple[list[Any], list[str]]:
        running = self.running.get(topic)
        if running is None:
            running = self.running[topic] = asyncio.ensure_future(self._read(settings, topic))
            running.add_done_callback(lambda _: self.running.pop(topic, None))
        return await asyncio.shield(running)

    async def _read(self, settings: Settings, topic: str) -> tuple[list[Any], list[str]]:
        from nsqworker.admin.dead_letters import list_dead_letters

        notes: list[str] = []
        async with self.turns:
            letters = await list_dead_letters(
                settings, topic, limit=LIST_LIMIT, on_note=notes.append
            )
        return letters, notes


_listings: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Listings] = (
    weakref.WeakKeyDictionary()
)


def _for_loop() -> _Listings:
    """The running loop's listings (a semaphore belongs to one loop)."""
    loop = asyncio.get_running_loop()
    if loop not in _listings:
        _listings[loop] = _Listings()
    return _listings[loop]


class BadOrder(ValueError):
    """Raised when an action's request is malformed; the message says what to send."""


@dataclass(frozen=True)
class Order:
    """One action: ``replay`` or ``purge`` of ``ids`` (None: all) on ``topic``."""

    action: str
    topic: str
    ids: tuple[str, ...] | None
    to: str | None = None

    @classmethod
    def parse(cls, action: str, doc: dict[str, Any]) -> Order:
        """Check a request body: ``{"topic": ..., "ids": [...]}`` or ``{"topic": ...,
        "all": true}``, and for replay an optional ``"to"``."""
        if action not in ("replay", "purge"):
            raise BadOrder(f"no action {action!r}: use replay or purge")
        topic = doc.get("topic")
        if not isinstance(topic, str) or not 0 < len(topic) <= MAX_NAME:
            raise BadOrder("topic must be the dead-letter topic's name")
        every, ids = doc.get("all") is True, doc.get("ids")
        if every == (ids is not None):
            raise BadOrder('send either "all": true or "ids": [...], not both or neither')
        if ids is not None and (
            not isinstance(ids, list)
            or not 0 < len(ids) <= MAX_IDS
            or not all(isinstance(i, str) and 0 < len(i) <= MAX_NAME for i in ids)
        ):
            raise BadOrder(f"ids must be a list of 1 to {MAX_IDS} dead-letter ids")
        to = doc.get("to")
        if to is not None and (action != "replay" or not isinstance(to, str) or not to):
            raise BadOrder('"to" is a topic name, and only for replay')
        return cls(action, topic, tuple(ids) if ids is not None else None, to)


async def list_letters(
    settings: Settings, topic: str, notes: list[str] | None = None
) -> tuple[list[DeadLetter], str | None]:
    """The dead letters of ``topic``, oldest first, and a problem to show instead;
    what the reader should know is appended to ``notes``."""
    if not topic:
        return [], None
    try:
        async with asyncio.timeout(LIST_TIMEOUT):
            letters, said = await _for_loop().read(settings, topic)
    except TimeoutError:
        return [], f"listing {topic} took longer than {LIST_TIMEOUT:g} s (with the others running)"
    except Exception as exc:
        return [], f"cannot list {topic}: {type(exc).__name__}: {exc}"
    if notes is not None:
        notes.extend(said)
    return list(letters), None


async def perform(
    settings: Settings, order: Order, sources: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Run ``order``; its report as JSON (counts, and the ids of each kind). A replay
    sends dead letters back only to ``sources`` (the topics of the tasks that
    dead-letter to the order's topic), or to the order's ``to``."""
    from nsqworker.admin.dead_letters import purge_dead_letters, replay_dead_letters

    ids = list(order.ids) if order.ids is not None else None
    if order.action == "replay":
        report: Any = await replay_dead_letters(
            settings, order.topic, ids=ids, to=order.to, sources=sources
        )
        names: tuple[str, ...] = ("replayed", "refused", "left")
    else:
        report = await purge_dead_letters(settings, order.topic, ids=ids)
        names = ("purged", "left")
    return {"action": order.action, "topic": order.topic, **_report(report, names)}


def _report(report: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Counts by kind, plus ``details``: id -> why, for refused and left ones (100 at most)."""
    result: dict[str, Any] = {}
    for name in names:
        result[name] = len(getattr(report, name))
    why = {**dict(getattr(report, "refused", {})), **dict(getattr(report, "errors", {}))}
    result["details"] = dict(list(why.items())[:100])
    result["notes"] = [str(n) for n in getattr(report, "notes", ())]
    return result
