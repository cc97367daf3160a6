"""``nsqworker tasks`` and ``nsqworker settings``: what would run, and with which settings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from nsqworker.cli.common import (
    AsJson,
    ConfigFile,
    NatsOption,
    NsqdOption,
    RabbitOption,
    Target,
    TransportOption,
    load_registry,
    load_settings,
    table_console,
)
from nsqworker.cli.safe import cell
from nsqworker.safe_text import one_line

if TYPE_CHECKING:
    from rich.text import Text

    from nsqworker.settings import Settings
    from nsqworker.task import TaskSpec

__all__ = ["pipeline_edges", "show_settings", "task_row", "tasks"]

# ---------------------------------------------------------------------------- tasks

_DEFAULTED = ("max_in_flight", "max_attempts", "retry_delay")


def tasks(
    target: Target,
    config: ConfigFile = None,
    as_json: AsJson = False,
    transport: TransportOption = None,
    nsqd: NsqdOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
) -> None:
    """List the tasks of MODULE with their settings; dimmed values are defaults."""
    settings = load_settings(
        config, transport=transport, nsqd_tcp_addresses=nsqd or None,
        nats_servers=nats or None, rabbitmq_stream_uri=rabbitmq,
    )  # fmt: skip
    registry = load_registry(target)
    rows = [task_row(spec, settings) for spec in registry]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"{_plural(len(rows), 'task')} in {target}, on {_where(settings)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    table.add_column("task", no_wrap=True)
    table.add_column("topic", no_wrap=True)
    table.add_column("channel", no_wrap=True)
    table.add_column("in flight", justify="right", no_wrap=True)
    table.add_column("attempts", justify="right", no_wrap=True)
    table.add_column("retry", justify="right", no_wrap=True)
    table.add_column("dead letter", overflow="fold", min_width=11)
    table.add_column("publishes", overflow="fold")
    table.add_column("timeout", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True, min_width=5)
    for row in rows:
        defaults = set(row["defaults"])
        resolved = [
            Text(_cell(name, row[name]), style="dim" if name in defaults else "")
            for name in _DEFAULTED
        ]
        name = row["name"]  # in full, as logs and metrics name it
        kind = row["kind"] if row["body"] is None else f"{row['kind']}, {row['body']}"
        publishes = cell(f"→ {row['publish_to']}" if row["publish_to"] else "-")
        cells = [cell(row["topic"]), cell(row["channel"]), *resolved, _dead_letter_text(row)]
        limit = _limit_text(row, defaults)
        table.add_row(cell(name), *cells, publishes, limit, cell(kind))
    console = table_console()
    console.print(table)
    for edge in pipeline_edges(rows):
        console.print(one_line(edge), highlight=False, markup=False)
    console.print(
        "[dim]dimmed[/dim]: the default from settings; @task(...) arguments override it",
        highlight=False,
    )
    scheduled = [row for row in rows if "schedule" in row]
    if scheduled:
        console.print()
        for row in scheduled:
            console.print(_schedule_text(row), highlight=False, soft_wrap=True)
        from nsqworker.schedules.runner import NO_LEADER, choose_leader

        if choose_leader(settings)[0] == "none":
            console.print(Text(f"warning: {NO_LEADER}", style="yellow"), soft_wrap=True)


def task_row(spec: TaskSpec, settings: Settings) -> dict[str, Any]:
    """One task as plain data, with options left to the settings filled in from them."""
    defaults = [name for name in _DEFAULTED if getattr(spec, name) is None]
    if spec.timeout is None:
        defaults.append("timeout")
    if spec.timeout_action is None:
        defaults.append("timeout_action")
    hook = spec.on_dead_letter
    return {
        "name": spec.name,
        "topic": spec.topic,
        "channel": spec.channel,
        **{
            name: getattr(spec, name) if name not in defaults else getattr(settings, name)
            for name in _DEFAULTED
        },
        "on_dead_letter": None if hook is None else _qualified(hook),
        "dead_letter_topic": spec.dead_letter_topic,
        "kind": "async" if spec.is_async else "sync",
        "body": None if spec.body is None else spec.body.name,
        "timeout": spec.timeout if spec.timeout is not None else settings.task_timeout,
        "timeout_action": spec.timeout_action or settings.timeout_action,
        "transport": settings.transport,
        "publish_to": spec.publish_to,
        "defaults": defaults,
        **({} if spec.schedule is None else {"schedule": schedule_info(spec)}),
    }


def _limit_text(row: dict[str, Any], defaults: set[str]) -> Text:
    """The timeout cell: ``30s, abandon`` (``-`` without a limit), each part dimmed
    when it is the settings' default."""
    from rich.text import Text

    if row["timeout"] is None:
        return Text("-", style="dim" if "timeout" in defaults else "")
    text = Text(f"{row['timeout']:g}s", style="dim" if "timeout" in defaults else "")
    text.append(", ")
    text.append(row["timeout_action"], style="dim" if "timeout_action" in defaults else "")
    return text


def pipeline_edges(rows: list[dict[str, Any]]) -> list[str]:
    """``a → topic → b, c`` for each task whose results go to a topic (``publish_to``),
    naming the tasks here that consume it."""
    edges = []
    for row in rows:
        if not row["publish_to"]:
            continue
        readers = [r["name"] for r in rows if r["topic"] == row["publish_to"]]
        to = ", ".join(readers) if readers else "(no task here reads it)"
        edges.append(f"pipeline: {row['name']} → {row['publish_to']} → {to}")
    return edges


def schedule_info(spec: TaskSpec, count: int = 3) -> dict[str, Any]:
    """A scheduled task's expressions, time zone and next ``count`` fire times (ISO, in
    the schedule's time zone; UTC ends in Z)."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from nsqworker.schedules.cron import format_tick

    schedule = spec.schedule
    assert schedule is not None
    utc = schedule.timezone.upper() in ("UTC", "ETC/UTC", "Z")
    ticks = schedule.upcoming(datetime.now(UTC), count)
    shown = [
        format_tick(t) if utc else t.astimezone(ZoneInfo(schedule.timezone)).isoformat()
        for t in ticks
    ]
    return {"expressions": list(schedule.expressions), "timezone": schedule.timezone, "next": shown}


def _schedule_text(row: dict[str, Any]) -> str:
    info = row["schedule"]
    zone = "" if info["timezone"].upper() == "UTC" else f" ({info['timezone']})"
    return (
        f"{row['name']} fires on {' | '.join(info['expressions'])}{zone}; "
        f"next: {', '.join(info['next'])}"
    )


def _where(settings: Settings) -> str:
    """The transport and where it connects: ``nsq (nsqd 127.0.0.1:4150)``."""
    from nsqworker.transport import create_transport

    try:
        described = create_transport(settings).describe()
    except Exception as exc:  # a transport whose client is not installed, say
        return f"{settings.transport} ({exc})"
    places = ", ".join(f"{kind} {where}" for kind, where in described.items())
    return f"{settings.transport} ({places})" if places else settings.transport


def _dead_letter_text(row: dict[str, Any]) -> Text:
    from rich.text import Text

    parts = []
    if row["on_dead_letter"]:
        parts.append(one_line(f"{row['on_dead_letter'].rpartition('.')[2]}()"))
    if row["dead_letter_topic"]:
        parts.append(one_line(f"→ {row['dead_letter_topic']}"))
    return Text("\n".join(parts) or "-")  # a line each, never markup


def _qualified(func: Any) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def _cell(name: str, value: Any) -> str:
    return f"{value:g}s" if name == "retry_delay" else str(value)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


# ---------------------------------------------------------------------------- settings


def show_settings(config: ConfigFile = None, as_json: AsJson = False) -> None:
    """Print the effective settings, where each value came from, and what it means."""
    settings = load_settings(config)
    described = settings.describe()
    if as_json:
        data = {
            name: {"value": _json_value(settings, name, shown), "source": source}
            for name, shown, source, _ in described
        }
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title="nsqworker settings", title_justify="left")
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", no_wrap=True)
    table.add_column("meaning", overflow="fold")
    for name, shown, source, doc in described:
        style = "dim" if source == "default" else "bold"
        table.add_row(name, cell(shown, style), Text(source, style=style), doc)
    table_console().print(table)


def _json_value(settings: Settings, name: str, shown: str) -> Any:
    """The typed value for JSON, except secrets, which stay as displayed (masked)."""
    from pydantic import SecretStr

    value = getattr(settings, name)
    if isinstance(value, SecretStr):
        return shown
    return settings.model_dump(mode="json", include={name})[name]
