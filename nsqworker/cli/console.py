"""``nsqworker console``: the web console over running ``nsqworker run`` processes.

Needs the ``console`` extra (Starlette, Jinja2, uvicorn). The broker options are those of
``run``: the console reads each task's backlog from the broker and works on dead letters
there. docs/operations.md (Console) shows it; docs/security.md says who may do what.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nsqworker.cli.common import (
    EXIT_USAGE,
    ConfigFile,
    LookupdOption,
    NatsOption,
    NsqdOption,
    RabbitOption,
    TransportOption,
)

__all__ = ["console"]

OVERRIDE_NAMES = {
    "console_workers": "--worker",
    "console_kubernetes_selector": "--kubernetes-selector",
    "console_kubernetes_namespace": "--namespace",
    "console_host": "--host",
    "console_port": "--port",
    "transport": "--transport",
    "nsqd_tcp_addresses": "--nsqd",
    "lookupd_http_addresses": "--lookupd",
    "nats_servers": "--nats",
    "rabbitmq_stream_uri": "--rabbitmq",
}


def console(
    worker: Annotated[
        list[str] | None,
        typer.Option(
            "--worker",
            metavar="URL",
            help="Health URL of an `nsqworker run` (http://host:port); repeat for several.",
            show_default=False,
        ),
    ] = None,
    kubernetes_selector: Annotated[
        str | None,
        typer.Option(
            "--kubernetes-selector",
            metavar="LABELS",
            help="Find the workers as the pods of this label selector (Kubernetes API).",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", metavar="NAME", help="Namespace of those pods.", show_default=False
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="Listen address (default 127.0.0.1).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", metavar="PORT", help="Listen port (default 8081).", show_default=False
        ),
    ] = None,
    transport: TransportOption = None,
    nsqd: NsqdOption = None,
    lookupd: LookupdOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
    config: ConfigFile = None,
) -> None:
    """Serve the web console: tasks, workers and dead letters (read-only unless a
    console_token is set, NSQWORKER_CONSOLE_TOKEN)."""
    from nsqworker.logging import configure_logging
    from nsqworker.settings import Settings, SettingsError

    try:
        settings = Settings.load(
            config,
            override_names=OVERRIDE_NAMES,
            **{
                k: v
                for k, v in {
                    "console_workers": worker or None,
                    "console_kubernetes_selector": kubernetes_selector,
                    "console_kubernetes_namespace": namespace,
                    "console_host": host,
                    "console_port": port,
                    "transport": transport,
                    "nsqd_tcp_addresses": nsqd or None,
                    "lookupd_http_addresses": lookupd or None,
                    "nats_servers": nats or None,
                    "rabbitmq_stream_uri": rabbitmq,
                }.items()
                if v is not None
            },
        )
    except SettingsError as exc:
        for problem in exc.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    configure_logging(settings.log_level, settings.log_format)
    try:
        import uvicorn

        from nsqworker.admin.console.app import create_app
        from nsqworker.admin.console.backlog import Backlog
        from nsqworker.admin.console.discovery import discovery_for
        from nsqworker.admin.console.fleet import Fleet
    except ImportError as exc:
        typer.echo(
            f"error: nsqworker console needs the console extra ({exc}): "
            "pip install 'nsq-worker[console]'",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE) from None
    try:
        discovery = discovery_for(settings)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    fleet = Fleet(discovery, lambda http: Backlog(settings, http), settings.console_poll_interval)
    app = create_app(settings, fleet)
    shown = f"[{settings.console_host}]" if ":" in settings.console_host else settings.console_host
    access = "actions need the token" if settings.console_token else "read-only (no console_token)"
    typer.echo(
        f"nsqworker console on http://{shown}:{settings.console_port} for "
        f"{discovery.description}; {access}",
        err=True,
    )
    uvicorn.run(
        app,
        host=settings.console_host,
        port=settings.console_port,
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,
    )
