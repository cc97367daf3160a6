"""The ``nsqworker`` command: ``run``, ``tasks``, ``settings`` and ``publish``.

Every command that reads settings takes ``--config FILE``; its options override the
``NSQWORKER_*`` environment, which overrides the file. Bad settings print one line per
problem (naming the field and its variable) and exit with code 2, without a traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nsqworker import __version__

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.task import Registry, TaskSpec

__all__ = ["app", "main"]

EXIT_USAGE = 2

app = typer.Typer(
    name="nsqworker",
    help="Run Python task handlers on NSQ topics.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Target = Annotated[
    str,
    typer.Argument(
        metavar="MODULE[:REGISTRY]",
        help="Module whose @task handlers to use, or module:attribute naming a Registry.",
        show_default=False,
    ),
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="Settings file (.toml, .json or .env); NSQWORKER_CONFIG names one too.",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"nsqworker {__version__} (Python {platform.python_version()})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Run Python task handlers on NSQ topics: supervised workers, retries, dead letters."""


# ---------------------------------------------------------------------------- run


@app.command()
def run(
    target: Target,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-w", help="Worker processes (default: the workers setting, 1)."),
    ] = None,
    config: ConfigFile = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning, error or critical.")
    ] = None,
    log_format: Annotated[str | None, typer.Option(help="console, json or auto.")] = None,
    health_port: Annotated[
        int | None, typer.Option(help="Port of /livez /readyz /metrics; 0 turns it off.")
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds a stop waits for running handlers before REQing them."),
    ] = None,
    hung_timeout: Annotated[
        float,
        typer.Option(min=1, help="Seconds without a heartbeat before a worker is killed."),
    ] = 60.0,
    crash_limit: Annotated[
        int, typer.Option(min=1, help="Worker deaths within --crash-window that end the run.")
    ] = 5,
    crash_window: Annotated[
        float, typer.Option(min=1, help="Seconds over which worker deaths are counted.")
    ] = 60.0,
) -> None:
    """Run the tasks in worker processes under a supervisor, until SIGTERM or Ctrl-C.

    SIGTERM or Ctrl-C drains (finish or requeue what is in flight); a second Ctrl-C kills.
    Exit codes: 0 drained, 1 workers kept dying, 2 bad usage, import or settings, 130 forced.
    """
    from nsqworker.logging import configure_logging
    from nsqworker.supervisor import Policy
    from nsqworker.supervisor import run as supervise
    from nsqworker.task import TaskImportError

    settings = _load_settings(
        config,
        workers=workers,
        log_level=log_level,
        log_format=log_format,
        health_port=health_port,
        drain_timeout=drain_timeout,
    )
    configure_logging(settings.log_level, settings.log_format)
    policy = Policy(hung_timeout=hung_timeout, crash_limit=crash_limit, crash_window=crash_window)
    try:  # OTEL_* variables are read in each worker process, where the spans are made
        code = supervise(target, settings, policy)
    except TaskImportError as exc:
        print_import_error(target, exc)
        code = EXIT_USAGE
    raise typer.Exit(code)


# ---------------------------------------------------------------------------- tasks

_DEFAULTED = ("max_in_flight", "max_attempts", "requeue_delay")


@app.command()
def tasks(target: Target, config: ConfigFile = None, as_json: AsJson = False) -> None:
    """List the tasks of MODULE with their settings; dimmed values are defaults."""
    settings = _load_settings(config)
    registry = _load_registry(target)
    rows = [task_row(spec, settings) for spec in registry]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(
        title=f"{_plural(len(rows), 'task')} in {target}",
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
    table.add_column("requeue", justify="right", no_wrap=True)
    table.add_column("dead letter", overflow="fold", min_width=11)
    table.add_column("kind", no_wrap=True, min_width=5)
    for row in rows:
        defaults = set(row["defaults"])
        resolved = [
            Text(_cell(name, row[name]), style="dim" if name in defaults else "")
            for name in _DEFAULTED
        ]
        name = row["name"].removeprefix(f"{target.partition(':')[0]}.")
        cells = [row["topic"], row["channel"], *resolved, _dead_letter_text(row), row["kind"]]
        table.add_row(name, *cells)
    console = Console()
    console.print(table)
    console.print(
        "[dim]dimmed[/dim]: the default from settings; @task(...) arguments override it",
        highlight=False,
    )


def task_row(spec: TaskSpec, settings: Settings) -> dict[str, Any]:
    """One task as plain data, with options left to the settings filled in from them."""
    defaults = [name for name in _DEFAULTED if getattr(spec, name) is None]
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
        "defaults": defaults,
    }


def _dead_letter_text(row: dict[str, Any]) -> str:
    parts = []
    if row["on_dead_letter"]:
        parts.append(f"{row['on_dead_letter'].rpartition('.')[2]}()")
    if row["dead_letter_topic"]:
        parts.append(f"→ {row['dead_letter_topic']}")
    return "\n".join(parts) or "-"


def _qualified(func: Any) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def _cell(name: str, value: Any) -> str:
    return f"{value:g}s" if name == "requeue_delay" else str(value)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


# ---------------------------------------------------------------------------- settings


@app.command("settings")
def show_settings(config: ConfigFile = None, as_json: AsJson = False) -> None:
    """Print the effective settings, where each value came from, and what it means."""
    settings = _load_settings(config)
    described = settings.describe()
    if as_json:
        data = {
            name: {"value": _json_value(settings, name, shown), "source": source}
            for name, shown, source, _ in described
        }
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title="nsqworker settings", title_justify="left")
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", no_wrap=True)
    table.add_column("meaning", overflow="fold")
    for name, shown, source, doc in described:
        style = "dim" if source == "default" else "bold"
        table.add_row(name, Text(shown, style=style), Text(source, style=style), doc)
    Console().print(table)


def _json_value(settings: Settings, name: str, shown: str) -> Any:
    """The typed value for JSON, except secrets, which stay as displayed (masked)."""
    from pydantic import SecretStr

    value = getattr(settings, name)
    if isinstance(value, SecretStr):
        return shown
    return settings.model_dump(mode="json", include={name})[name]


# ---------------------------------------------------------------------------- publish


@app.command()
def publish(
    topic: Annotated[
        str, typer.Argument(metavar="TOPIC", help="Topic to publish to.", show_default=False)
    ],
    body: Annotated[
        str | None,
        typer.Argument(
            metavar="BODY", help="Message body; omit or '-' to send each line of stdin."
        ),
    ] = None,
    nsqd: Annotated[
        list[str] | None,
        typer.Option(
            "--nsqd",
            metavar="HOST:PORT",
            help="nsqd TCP address; repeat for several (default: nsqd_tcp_addresses).",
        ),
    ] = None,
    delay: Annotated[
        float | None, typer.Option(help="Seconds before nsqd delivers it (DPUB).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Lines per MPUB when reading stdin.")] = 100,
) -> None:
    """Publish one message, or one per line of stdin."""
    from nsqworker.publish_cli import publish_command
    from nsqworker.supervisor import configure_telemetry

    configure_telemetry()
    code = publish_command(topic, body, nsqd=list(nsqd or []), delay=delay, batch_size=batch_size)
    raise typer.Exit(code)


# ---------------------------------------------------------------------------- helpers


def _load_settings(config: Path | None, **overrides: Any) -> Settings:
    """``Settings.load``; on a bad value print its problems and exit 2."""
    from nsqworker.settings import Settings, SettingsError

    try:
        return Settings.load(config, **overrides)
    except SettingsError as exc:
        err = Console(stderr=True, highlight=False)
        err.print("[red]error:[/red] invalid settings", markup=True)
        for problem in exc.problems:
            err.print(f"  {problem}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None


def _load_registry(target: str) -> Registry:
    """``load_registry``; on an import problem report it once and exit 2."""
    from nsqworker.task import TaskImportError, load_registry

    try:
        return load_registry(target)
    except TaskImportError as exc:
        print_import_error(target, exc)
        raise typer.Exit(EXIT_USAGE) from None


def print_import_error(target: str, exc: BaseException) -> None:
    """Report a failed ``load_registry(target)`` once, on stderr.

    When the module raised, the user's traceback comes first (without nsqworker's and
    importlib's frames), then one line ``could not import TARGET: <exception>``. Other
    problems (no such module, no tasks, not a Registry) are one ``error:`` line.
    """
    cause = exc.__cause__
    if cause is None or _is_missing_target(target, cause):
        sys.stderr.write(f"error: {exc}\n")
        sys.stderr.flush()
        return
    tb = traceback.TracebackException.from_exception(cause)
    tb.stack = traceback.StackSummary.from_list([f for f in tb.stack if not _ours(f.filename)])
    reason = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    sys.stderr.write("".join(tb.format()) + f"could not import {target}: {reason}\n")
    sys.stderr.flush()


def _is_missing_target(target: str, cause: BaseException) -> bool:
    """True when the module named by ``target`` (or a parent package) does not exist."""
    if not isinstance(cause, ModuleNotFoundError) or cause.name is None:
        return False
    module = target.partition(":")[0].strip()
    return module == cause.name or module.startswith(cause.name + ".")


_OUR_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (__file__, importlib.__file__ or "importlib")
)


def _ours(filename: str) -> bool:
    """Frames of nsqworker or importlib, which the user did not write."""
    return filename.startswith("<frozen ") or os.path.abspath(filename).startswith(_OUR_DIRS)


def main() -> None:
    """Console-script entry point: ``nsqworker ...`` and ``python -m nsqworker``."""
    app(prog_name="nsqworker")
