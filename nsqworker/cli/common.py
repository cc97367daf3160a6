"""What the ``nsqworker`` verbs share: argument types, exit codes, loading with clean errors.

Every command that reads settings takes ``--config FILE``; its options override the
``NSQWORKER_*`` environment, which overrides the file. Bad settings print one line per
problem (naming the field and where it came from: flag, variable or file) and exit with code 2, without a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.task import Registry

__all__ = [
    "EXIT_USAGE",
    "AsJson",
    "ConfigFile",
    "NatsOption",
    "RabbitOption",
    "Target",
    "flag",
    "load_registry",
    "load_settings",
    "print_import_error",
    "table_console",
]

EXIT_USAGE = 2


class Command(TyperCommand):
    """A command whose ``-h/--help`` shows no ``<bool>`` placeholder (a flag takes no value)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class Group(TyperGroup):
    """A command group whose ``-h/--help`` shows no ``<bool>`` placeholder."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


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
AsJson = Annotated[bool, typer.Option("--json", metavar="", help="Print JSON for machines.")]
TransportOption = Annotated[
    str | None,
    typer.Option(
        "--transport",
        metavar="NAME",
        help="The broker: nsq (default), nats or rabbitmq-stream (docs/transports.md).",
        show_default=False,
    ),
]
NsqdOption = Annotated[
    list[str] | None,
    typer.Option(
        "--nsqd",
        metavar="HOST:PORT",
        help="nsqd TCP address; repeat for several (default: nsqd_tcp_addresses).",
        show_default=False,
    ),
]
LookupdOption = Annotated[
    list[str] | None,
    typer.Option(
        "--lookupd",
        metavar="URL",
        help="nsqlookupd HTTP address; repeat for several (default: lookupd_http_addresses).",
        show_default=False,
    ),
]
NatsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--nats",
        metavar="URL",
        help="NATS server, nats://host:port; repeat for several (with --transport nats).",
        show_default=False,
    ),
]
RabbitOption = Annotated[
    str | None,
    typer.Option(
        "--rabbitmq",
        metavar="URI",
        help="rabbitmq-stream://user:password@host:5552/vhost (with --transport rabbitmq-stream).",
        show_default=False,
    ),
]


def flag(field: str) -> str:
    """The command-line flag of a setting: ``log_format`` -> ``--log-format``."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


#: Settings whose flag is not their name with dashes.
FLAGS = {
    "nsqd_tcp_addresses": "--nsqd",
    "lookupd_http_addresses": "--lookupd",
    "nats_servers": "--nats",
    "rabbitmq_stream_uri": "--rabbitmq",
}


def load_settings(config: Path | None, **overrides: Any) -> Settings:
    """``Settings.load``; on a bad value print its problems and exit 2.

    ``overrides`` are the command's options by setting name; problems name their flags.
    """
    from nsqworker.settings import Settings, SettingsError

    try:
        return Settings.load(config, override_names={f: flag(f) for f in overrides}, **overrides)
    except SettingsError as exc:
        from rich.console import Console

        err = Console(stderr=True, highlight=False)
        err.print("[red]error:[/red] invalid settings", markup=True)
        for problem in exc.problems:  # one line each, never wrapped mid-sentence
            err.print(f"  {problem}", markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None


def load_registry(target: str) -> Registry:
    """``load_registry``; on an import problem report it once and exit 2."""
    from nsqworker.task import TaskImportError
    from nsqworker.task import load_registry as load

    try:
        return load(target)
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
    tb = _trimmed(traceback.TracebackException.from_exception(cause))
    reason = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    sys.stderr.write("".join(tb.format()) + f"could not import {target}: {reason}\n")
    sys.stderr.flush()


def _trimmed(tb: traceback.TracebackException) -> traceback.TracebackException:
    """``tb`` without nsqworker's and importlib's frames, and without the exceptions it
    chains (``During handling of ...``) that happened entirely in them."""
    tb.stack = traceback.StackSummary.from_list([f for f in tb.stack if not _ours(f.filename)])
    for attr in ("__cause__", "__context__"):
        inner = getattr(tb, attr)
        if inner is not None and not _trimmed(inner).stack:
            setattr(tb, attr, None)
    return tb


def _is_missing_target(target: str, cause: BaseException) -> bool:
    """True when the module named by ``target`` (or a parent package) does not exist."""
    if not isinstance(cause, ModuleNotFoundError) or cause.name is None:
        return False
    module = target.partition(":")[0].strip()
    return module == cause.name or module.startswith(cause.name + ".")


# The nsqworker package (two levels up from here) and importlib.
_OUR_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (os.path.dirname(__file__), importlib.__file__ or "importlib")
)


def _ours(filename: str) -> bool:
    """Frames of nsqworker or importlib, which the user did not write."""
    return filename.startswith("<frozen ") or os.path.abspath(filename).startswith(_OUR_DIRS)


def table_console(**options: Any) -> Any:
    """A rich ``Console`` for tables on standard output: the terminal's width on a
    terminal; piped (``| less``, ``| grep``) with no ``COLUMNS`` set, wide enough that
    no row wraps, one line a row (rich would squeeze it to 80 columns)."""
    import os

    from rich.console import Console

    console = Console(**options)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = 10_000  # a table takes its natural width, never this
    return console
