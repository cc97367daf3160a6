"""``nsqworker run``: the tasks of a module in supervised worker processes."""

from __future__ import annotations

from typing import Annotated

import typer

from nsqworker.cli.common import EXIT_USAGE, ConfigFile, Target, load_settings, print_import_error

__all__ = ["run"]


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

    settings = load_settings(
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
