"""``nsqworker run``: the tasks of a module in supervised worker processes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from nsqworker.cli.common import (
    EXIT_USAGE,
    ConfigFile,
    LookupdOption,
    NatsOption,
    NsqdOption,
    RabbitOption,
    Target,
    TransportOption,
    flag,
    load_registry,
    load_settings,
    print_import_error,
)

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["run"]


def run(
    target: Target,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-w", help="Worker processes (default: the workers setting, 1)."),
    ] = None,
    config: ConfigFile = None,
    transport: TransportOption = None,
    nsqd: NsqdOption = None,
    lookupd: LookupdOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning, error or critical.")
    ] = None,
    log_format: Annotated[str | None, typer.Option(help="console, json or auto.")] = None,
    health_port: Annotated[
        int | None, typer.Option(help="Port of /livez /readyz /metrics; 0 turns it off.")
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a stop waits for running handlers before returning their messages."
        ),
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
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            metavar="",  # a plain flag: no <bool> placeholder in --help
            help="Restart the workers (draining first) when a source file of the task "
            "package changes; for development.",
        ),
    ] = False,
    reload_in_cluster: Annotated[
        bool,
        typer.Option(
            "--reload-in-cluster",
            metavar="",
            help="Allow reloading in a Kubernetes pod (KUBERNETES_SERVICE_HOST set), "
            "refused otherwise; for a development cluster.",
        ),
    ] = False,
) -> None:
    """Run the tasks in worker processes under a supervisor, until SIGTERM or Ctrl-C.

    SIGTERM or Ctrl-C drains (finish or requeue what is in flight); a second Ctrl-C kills.
    Exit codes: 0 drained, 1 workers kept dying, 2 bad usage, import or settings, 130 forced.
    """
    from nsqworker.logging import configure_logging
    from nsqworker.supervisor import RestartPolicy
    from nsqworker.supervisor import run as supervise
    from nsqworker.task import TaskImportError

    given = {
        "transport": transport,
        "workers": workers,
        "nsqd_tcp_addresses": nsqd or None,
        "lookupd_http_addresses": lookupd or None,
        "nats_servers": nats or None,
        "rabbitmq_stream_uri": rabbitmq,
        "log_level": log_level,
        "log_format": log_format,
        "health_port": health_port,
        "drain_timeout": drain_timeout,
    }
    settings = load_settings(config, **given)
    load_registry(target)  # an import problem first: it is reported once, here
    problem = transport_problem(settings) or (reload and _reload_problem(reload_in_cluster))
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(EXIT_USAGE)
    configure_logging(settings.log_level, settings.log_format)
    if reload:
        from nsqworker.logging import get_logger
        from nsqworker.reload import WARNING

        get_logger("nsqworker.supervisor").warning(WARNING)
    policy = RestartPolicy(
        hung_timeout=hung_timeout, crash_limit=crash_limit, crash_window=crash_window
    )
    spelled = {name: flag(name) for name, value in given.items() if value is not None}
    warn_unreachable(settings)
    try:  # OTEL_* variables are read in each worker process, where the spans are made
        code = supervise(target, settings, policy, spelled=spelled, reload=reload)
    except TaskImportError as exc:
        print_import_error(target, exc)
        code = EXIT_USAGE
    raise typer.Exit(code)


def _reload_problem(in_cluster: bool) -> str | None:
    import importlib.util
    import os

    from nsqworker.reload import MISSING_HINT, in_cluster_refusal

    if importlib.util.find_spec("watchfiles") is None:
        return MISSING_HINT
    return in_cluster_refusal(os.environ, in_cluster)


def transport_problem(settings: Settings) -> str | None:
    """Why ``nsqworker run`` cannot start on the settings' transport, or None."""
    if settings.transport == "memory":
        return (
            "the memory transport lives in one process, and nsqworker run starts worker "
            "processes: use it with an embedded Worker in tests (docs/testing.md), or pass "
            "--transport nsq"
        )
    if settings.transport == "nsq" and not (
        settings.nsqd_tcp_addresses or settings.lookupd_http_addresses
    ):
        return (
            "no nsqd or nsqlookupd address to consume from: pass --nsqd 127.0.0.1:4150 "
            "or --lookupd http://127.0.0.1:4161, or set NSQWORKER_NSQD_TCP_ADDRESSES or "
            "NSQWORKER_LOOKUPD_HTTP_ADDRESSES (no nsqd yet? `nsqworker dev broker` starts one "
            "and prints them)"
        )
    import importlib.util

    if settings.transport == "nats" and importlib.util.find_spec("nats") is None:
        return "the NATS transport needs nats-py: pip install 'nsq-worker[nats]'"
    if settings.transport == "rabbitmq-stream" and importlib.util.find_spec("rstream") is None:
        return "the RabbitMQ Streams transport needs rstream: pip install 'nsq-worker[rabbitmq]'"
    return None


def warn_unreachable(settings: Settings, timeout: float = 1.0) -> None:
    """Log a warning for each nsqd or nsqlookupd address that refuses a connection now.

    Not an error: a broker may come up after the worker, and the workers keep retrying.
    """
    if settings.transport not in ("nsq", "nats", "rabbitmq-stream"):
        return
    import socket
    from urllib.parse import urlsplit

    from nsqworker.logging import get_logger

    targets = [
        ("nsqd", a, a.rpartition(":")[0], int(a.rpartition(":")[2]))
        for a in settings.nsqd_tcp_addresses
    ]
    for url in settings.lookupd_http_addresses:
        parts = urlsplit(url)
        default = 443 if parts.scheme == "https" else 80
        targets.append(("nsqlookupd", url, parts.hostname or "", parts.port or default))
    if settings.transport == "nats":
        servers = settings.nats_servers or ["nats://127.0.0.1:4222"]
        targets = [("NATS server", u, *_host_port(u)) for u in servers]
    if settings.transport == "rabbitmq-stream":
        from nsqworker.settings.streams import stream_endpoint

        host, port = stream_endpoint(settings.rabbitmq_stream_uri.get_secret_value())
        targets = [("RabbitMQ streams", f"{host}:{port}", host, port)]
    for kind, shown, host, port in targets:
        try:
            socket.create_connection((host.strip("[]"), port), timeout=timeout).close()
        except OSError as exc:
            reason = (exc.strerror or str(exc) or type(exc).__name__).lower()
            get_logger("nsqworker.supervisor").warning(
                f"{kind} {shown} does not answer ({reason}); not subscribed yet: "
                "the workers keep retrying, and /readyz says 503 until they subscribe"
            )


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "", parts.port or 4222
