"""The ``nsqworker`` command: ``run``, ``tasks``, ``settings``, ``inflight``, ``publish``,
``rpc``, ``dev``, ``dead-letters`` and ``console``.

One module per verb group (:mod:`.run`, :mod:`.inspect` for ``tasks`` and ``settings``,
:mod:`.publish`, :mod:`.rpc`, :mod:`.dev`), what they share in :mod:`.common`; this module
assembles the app.
Commands import what they need when they run, so ``nsqworker --version`` stays fast.
"""

from __future__ import annotations

import platform
from typing import Annotated

import typer

from nsqworker import __version__
from nsqworker.cli.common import Command, Group
from nsqworker.cli.console import console
from nsqworker.cli.dead_letters import app as dead_letters_app
from nsqworker.cli.dev import app as dev_app
from nsqworker.cli.inflight import inflight
from nsqworker.cli.inspect import show_settings, tasks
from nsqworker.cli.publish import publish
from nsqworker.cli.rpc import app as rpc_app
from nsqworker.cli.run import run

__all__ = ["app", "main"]

app = typer.Typer(
    name="nsqworker",
    cls=Group,
    help="Run Python task handlers on NSQ, NATS JetStream or RabbitMQ Streams.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
            metavar="",
            callback=_show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Run Python task handlers on NSQ, NATS JetStream or RabbitMQ Streams: supervised
    workers, retries, dead letters."""


# In this order in --help.
app.command(cls=Command)(run)
app.command(cls=Command)(tasks)
app.command("settings", cls=Command)(show_settings)
app.command(cls=Command)(inflight)
app.command(cls=Command)(publish)
app.add_typer(rpc_app)
app.add_typer(dev_app)
app.add_typer(dead_letters_app)
app.command(cls=Command)(console)


def main() -> None:
    """Console-script entry point: ``nsqworker ...`` and ``python -m nsqworker``."""
    app(prog_name="nsqworker")
