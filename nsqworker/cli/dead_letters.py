"""``nsqworker dead-letters list|replay|purge``: the dead letters of a topic, on every
transport (:mod:`nsqworker.admin.dead_letters` does the work).

Output: ``list`` prints a table (or ``--json``) on standard output; ``replay`` and
``purge`` print one line per refused or failed dead letter and a summary line on
standard error. Exit codes: 0 done, 1 some dead letter was left or refused (not
replayed or not removed) or the broker could not be reached, 2 bad usage or settings,
130 interrupted.
Every id and body is hostile text: it is printed without markup and with control
characters escaped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nsqworker.cli.common import (
    EXIT_USAGE,
    AsJson,
    Command,
    ConfigFile,
    Group,
    LookupdOption,
    NatsOption,
    NsqdOption,
    RabbitOption,
    TransportOption,
    load_registry,
    load_settings,
    table_console,
)

if TYPE_CHECKING:
    from rich.console import Console

    from nsqworker.admin.dead_letters import DeadLetter
    from nsqworker.settings import Settings

__all__ = ["app", "parse_duration"]

EXIT_LEFT = 1

app = typer.Typer(
    name="dead-letters",
    cls=Group,
    help="List, replay and purge the dead letters of a topic (docs/operations.md).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)

DeadTopic = Annotated[
    str,
    typer.Argument(
        metavar="DEAD_LETTER_TOPIC",
        help="The task's dead_letter_topic.",
        show_default=False,
    ),
]
Ids = Annotated[
    list[str] | None,
    typer.Option(
        "--id",
        metavar="ID",
        help="A dead letter's id (from list), or the original message's id (from the"
        " worker's dead-letter log line); repeat for several.",
    ),
]
All = Annotated[bool, typer.Option("--all", metavar="", help="Every dead letter on the topic.")]
Wait = Annotated[
    float,
    typer.Option(
        "--wait",
        metavar="SECONDS",
        min=0.1,
        max=600,
        help="NSQ and RabbitMQ Streams: seconds without a new message that end a read.",
    ),
]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``30s``, ``15m``, ``2h``, ``7d``, ``1w`` or ``1h30m``."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ValueError(
                f"not a duration: {text!r} (use seconds, or 30s, 15m, 2h, 7d, 1h30m)"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"not a duration: {text!r} (must be >= 0)")
    return seconds


def _settings(
    config: Path | None,
    transport: str | None,
    nsqd: list[str] | None,
    lookupd: list[str] | None,
    nats: list[str] | None,
    rabbitmq: str | None,
) -> Settings:
    return load_settings(
        config,
        transport=transport,
        nsqd_tcp_addresses=nsqd or None,
        lookupd_http_addresses=lookupd or None,
        nats_servers=nats or None,
        rabbitmq_stream_uri=rabbitmq,
    )


def _err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    from rich.text import Text

    _err().print(Text.assemble(("error: ", "red"), message))
    return typer.Exit(code)


def _run(coro: Any) -> Any:
    """Run the library call; a bad topic or settings exit 2, an unreachable broker 1."""
    from nsqworker.cli.publish import _quiet_library_logs
    from nsqworker.errors import ConfigurationError, NSQWorkerError

    try:
        with _quiet_library_logs():
            return asyncio.run(coro)
    except ConfigurationError as exc:
        raise _fail(" ".join(str(exc).split())) from None
    except (NSQWorkerError, OSError, TimeoutError) as exc:
        raise _fail(" ".join(str(exc).split()) or type(exc).__name__, EXIT_LEFT) from None
    except KeyboardInterrupt:
        _err().print("interrupted")
        raise typer.Exit(130) from None


@app.command("list", cls=Command)
def list_(
    topic: DeadTopic,
    limit: Annotated[
        int | None, typer.Option(min=0, help="Show the oldest N only.", show_default=False)
    ] = None,
    as_json: AsJson = False,
    wait: Wait = 1.0,
    config: ConfigFile = None,
    transport: TransportOption = None,
    nsqd: NsqdOption = None,
    lookupd: LookupdOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
) -> None:
    """List the dead letters of a topic, oldest first; nothing is removed or reordered."""
    from nsqworker.admin.dead_letters import list_dead_letters

    settings = _settings(config, transport, nsqd, lookupd, nats, rabbitmq)
    letters = _run(list_dead_letters(settings, topic, limit=limit, on_note=_note, quiet=wait))
    if as_json:
        typer.echo(json.dumps([d.to_json() for d in letters], indent=2, ensure_ascii=True))
        return
    _print_table(topic, letters)


def _print_table(topic: str, letters: list[DeadLetter]) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from nsqworker.admin.envelopes import preview

    table = Table(
        title=Text(f"{len(letters)} dead letters on {preview(topic.encode(), 200)}"),
        title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
    )  # fmt: skip
    for column in ("id", "rejected (UTC)", "task", "topic", "attempts", "reason", "body"):
        table.add_column(column, justify="right" if column == "attempts" else "left",
                         overflow="fold", no_wrap=column in ("id", "rejected (UTC)"))  # fmt: skip

    def cell(value: object) -> Text:
        return Text("-" if value is None else preview(str(value).encode(), 60), style="")

    for letter in letters:
        when = letter.rejected_at
        body = Text(letter.body_preview)
        if letter.problem is not None:
            body = Text.assemble(
                ("not replayable: ", "bold red"),
                preview(letter.problem.encode(), 200),
                "\n",
                letter.body_preview,
            )
        table.add_row(
            cell(letter.id), Text(when.strftime("%Y-%m-%d %H:%M:%S") if when else "-"),
            cell(letter.task), cell(letter.topic), cell(letter.attempts), cell(letter.reason),
            body,
        )  # fmt: skip
    table_console(highlight=False).print(table)


@app.command(cls=Command)
def replay(
    topic: DeadTopic,
    all_: All = False,
    ids: Ids = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to", metavar="TOPIC", help="Publish to this topic instead of the original."
        ),
    ] = None,
    tasks: Annotated[
        str | None,
        typer.Option(
            "--tasks",
            metavar="MODULE",
            help="The tasks module (as for nsqworker run): dead letters go back only to"
            " the topics of its tasks that dead-letter to this topic.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", metavar="", help="Say what would be replayed; change nothing."),
    ] = False,
    as_json: AsJson = False,
    wait: Wait = 1.0,
    config: ConfigFile = None,
    transport: TransportOption = None,
    nsqd: NsqdOption = None,
    lookupd: LookupdOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
) -> None:
    """Publish dead letters' original bodies again (fresh attempts), oldest first.

    A dead letter goes back to its original topic only if a task of --tasks MODULE reads
    that topic and dead-letters here; --to TOPIC names the destination instead. Each is
    removed only after the broker acknowledged its publish; foreign messages, truncated
    bodies and other destinations are refused, never replayed. Exit 1 if any was refused
    or left.
    """
    from nsqworker.admin.dead_letters import replay_dead_letters, replay_sources

    if all_ == bool(ids):
        raise _fail("say which dead letters: --all, or --id ID (repeatable)")
    settings = _settings(config, transport, nsqd, lookupd, nats, rabbitmq)
    sources = None
    if tasks is not None:
        sources = replay_sources(load_registry(tasks), topic)
        if not sources and to is None:
            raise _fail(f"no task of {tasks} dead-letters to {_show(topic)}: pass --to TOPIC")
    chosen = None if all_ else ids
    replaying = replay_dead_letters(
        settings, topic, ids=chosen, to=to, sources=sources, dry_run=dry_run, quiet=wait
    )
    report = _run(replaying)
    err = _err()
    from rich.text import Text

    for letter_id, why in report.refused.items():
        err.print(Text(f"refused {_show(letter_id)}: {_show(why, 300)}"))
    for letter_id in report.left:
        err.print(Text(f"left {_show(letter_id)}: {_show(report.errors.get(letter_id, ''), 300)}"))
    for note in report.notes:
        _note(note)
    err.print(Text(report.summary()))
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(report), indent=2, ensure_ascii=True))
    raise typer.Exit(EXIT_LEFT if report.left or report.refused else 0)


@app.command(cls=Command)
def purge(
    topic: DeadTopic,
    all_: All = False,
    ids: Ids = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Those rejected longer ago than this: 90, 30s, 15m, 2h, 7d.",
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", metavar="", help="Do not ask for confirmation.")
    ] = False,
    as_json: AsJson = False,
    wait: Wait = 1.0,
    config: ConfigFile = None,
    transport: TransportOption = None,
    nsqd: NsqdOption = None,
    lookupd: LookupdOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
) -> None:
    """Remove dead letters for good: --all, --id ID ..., or --older-than DURATION.

    Asks for confirmation on a terminal unless --yes; off a terminal, --all and
    --older-than need --yes. Exit 1 if any was left.
    """
    from rich.text import Text

    from nsqworker.admin.dead_letters import purge_dead_letters

    if sum((all_, bool(ids), older_than is not None)) != 1:
        raise _fail(
            "say which dead letters: one of --all, --id ID (repeatable), --older-than DURATION"
        )
    seconds = None
    if older_than is not None:
        try:
            seconds = parse_duration(older_than)
        except ValueError as exc:
            raise _fail(f"--older-than: {exc}") from None
    settings = _settings(config, transport, nsqd, lookupd, nats, rabbitmq)
    if not yes and not ids and not _interactive():
        raise _fail(
            "purge --all or --older-than removes dead letters for good, and nobody is here"
            " to confirm (standard input is not a terminal): add --yes"
        )
    if not yes and _interactive():
        which = (
            "every dead letter" if all_ else f"{len(ids or [])} dead letters by id"
            if ids else f"the dead letters rejected more than {older_than} ago"
        )  # fmt: skip
        if not typer.confirm(f"Remove {which} on {_show(topic)} for good?", default=False):
            _err().print("nothing removed")
            raise typer.Exit(EXIT_LEFT)
    report = _run(
        purge_dead_letters(settings, topic, ids=ids or None, older_than=seconds, quiet=wait)
    )
    err = _err()
    for letter_id in report.left:
        err.print(Text(f"left {_show(letter_id)}: {_show(report.errors.get(letter_id, ''), 300)}"))
    for note in report.notes:
        _note(note)
    err.print(Text(report.summary()))
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(report), indent=2, ensure_ascii=True))
    raise typer.Exit(EXIT_LEFT if report.left else 0)


def _note(text: str) -> None:
    from rich.text import Text

    _err().print(Text.assemble(("note: ", "yellow"), text))


def _interactive() -> bool:
    """Whether a person can answer a question: standard input is a terminal."""
    return sys.stdin.isatty()


def _show(text: str, chars: int = 80) -> str:
    from nsqworker.admin.envelopes import preview

    return preview(text.encode("utf-8", "replace"), chars)
