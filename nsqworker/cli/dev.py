"""``nsqworker dev broker``: a local broker for developing a project, in one step.

Starts, on 127.0.0.1, what a transport needs: nsqd and nsqlookupd for ``nsq`` (installed
binaries, else podman or docker, else the official release downloaded and checked:
:mod:`nsqworker.cli.dev_nsq`), a nats-server with JetStream for ``nats``, RabbitMQ with
the stream plugin for ``rabbitmq-stream``, from the binaries the machine has (found like
the test fixtures find them: :mod:`nsqworker.testing.locations`); prints the addresses and the
``export`` line for ``nsqworker run``; stops the broker on Ctrl-C, SIGTERM or SIGHUP.
When a binary is missing it says how to install it and exits 1.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from nsqworker.cli.common import EXIT_USAGE, Command, Group
from nsqworker.cli.dev_nsq import STANDARD_PORTS as NSQ_PORTS
from nsqworker.cli.local_broker import BrokerError, LocalBroker

__all__ = ["BrokerError", "LocalBroker", "app", "broker", "start_broker"]

TRANSPORTS = ("nsq", "nats", "rabbitmq-stream")
#: The ports each broker listens on by default, as its documentation gives them.
STANDARD_PORTS = {
    "nsq": NSQ_PORTS,
    "nats": {"client": 4222, "monitoring": 8222},
    "rabbitmq-stream": {"stream": 5552, "AMQP": 5672},
}

app = typer.Typer(
    name="dev",
    cls=Group,
    help="Development helpers for your own project: a local broker in one step.",
    no_args_is_help=True,
)


def _check_ports(transport: str) -> None:
    from nsqworker.testing.ports import port_is_free

    for what, port in STANDARD_PORTS[transport].items():
        if not port_is_free(port):
            raise BrokerError(
                f"port {port} ({what}) on 127.0.0.1 is taken, by another broker perhaps:"
                " stop it, or add --free-ports to use free ports instead"
            )


def _start_nsq(standard: bool, data_dir: Path | None, bin_dir: Path | None) -> LocalBroker:
    from nsqworker.cli.dev_nsq import start_nsq

    return start_nsq(standard, data_dir, bin_dir)


def _start_nats(standard: bool, data_dir: Path | None, bin_dir: Path | None) -> LocalBroker:
    from nsqworker.testing.nats import NatsServerProcess, find_nats_server

    server = NatsServerProcess(
        name="dev", binary=find_nats_server(str(bin_dir) if bin_dir else None), store_dir=data_dir
    )
    if standard:
        server.port, server.http_port = STANDARD_PORTS["nats"].values()
    server.start()
    return LocalBroker(
        transport="nats",
        addresses={
            "client (JetStream on)": server.url,
            "monitoring": f"http://127.0.0.1:{server.http_port}",
        },
        env={"NSQWORKER_TRANSPORT": "nats", "NSQWORKER_NATS_SERVERS": server.url},
        logs=[server.log_path],
        alive=lambda: server.running,
        stop=server.close,
        notes=[f"JetStream store: {server.store_dir / 'js'}"],
    )


def _start_rabbitmq(standard: bool, data_dir: Path | None, bin_dir: Path | None) -> LocalBroker:
    from nsqworker.testing.ports import free_ports
    from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

    if data_dir is not None:
        raise BrokerError(
            "--data-dir is for nsq and nats: RabbitMQ keeps its data inside its root"
            " filesystem, and removes it at stop"
        )
    server = RabbitMQProcess(find_rootfs())
    if standard:
        server.stream_port, server.amqp_port = STANDARD_PORTS["rabbitmq-stream"].values()
        server.dist_port, server.epmd_port = free_ports(2)
    _say(f"starting RabbitMQ from {server.rootfs} (10-30 s)...")
    server.start()
    return LocalBroker(
        transport="rabbitmq-stream",
        addresses={
            "stream (rabbitmq-stream://)": f"127.0.0.1:{server.stream_port}",
            "AMQP 0.9.1": f"127.0.0.1:{server.amqp_port}",
        },
        env={"NSQWORKER_TRANSPORT": "rabbitmq-stream", "NSQWORKER_RABBITMQ_STREAM_URI": server.uri},
        logs=[server.log_path],
        alive=lambda: server.running,
        stop=server.close,
        notes=["user guest, password guest, virtual host /"],
    )


_STARTERS = {"nsq": _start_nsq, "nats": _start_nats, "rabbitmq-stream": _start_rabbitmq}


def start_broker(
    transport: str,
    *,
    standard_ports: bool = True,
    data_dir: Path | None = None,
    bin_dir: Path | None = None,
) -> LocalBroker:
    """Start a local broker for ``transport`` and return it running.

    Raises:
        BrokerError: a standard port is taken, or the broker could not start.
        FileNotFoundError: its binary (or RabbitMQ's root filesystem) is missing; the
            message says how to install it.
    """
    from nsqworker.testing.processes import NsqProcessError

    if transport not in _STARTERS:
        raise BrokerError(f"--transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
    if standard_ports:
        _check_ports(transport)
    try:
        return _STARTERS[transport](standard_ports, data_dir, bin_dir)
    except NsqProcessError as exc:
        raise BrokerError(str(exc)) from None


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _serve(local: LocalBroker) -> int:
    """Print how to use ``local``, wait for a stop signal (or the broker's death), stop it."""
    stopping = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    width = max(len(label) for label in local.addresses)
    lines = [f"{local.transport} broker ready on 127.0.0.1:"]
    lines += [f"  {label:<{width}}  {address}" for label, address in local.addresses.items()]
    lines += [f"  {note}" for note in local.notes]
    lines += [f"  logs: {', '.join(map(str, local.logs))}", "In your project's shell:"]
    lines += [f"  {local.export_line()}", "Ctrl-C stops it."]
    print("\n".join(lines), flush=True)
    died = False
    while not stopping.wait(0.5):
        if not local.alive():
            died = True
            break
    if died:
        _say(f"error: the {local.transport} broker stopped by itself; see {local.logs[0]}")
    else:
        _say(f"{received[0]}: stopping the {local.transport} broker")
    local.stop()
    _say("stopped")
    return 1 if died else 0


def broker(
    transport: Annotated[
        str,
        typer.Option("--transport", "-t", metavar="NAME", help="nsq, nats or rabbitmq-stream."),
    ] = "nsq",
    free_ports: Annotated[
        bool,
        typer.Option(
            "--free-ports",
            metavar="",
            help="Listen on free ports instead of the standard ones (nsq 4150/4151/4160/4161,"
            " nats 4222/8222, rabbitmq-stream 5552/5672).",
        ),
    ] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            metavar="DIR",
            help="Keep the broker's data here (nsq, nats); by default a temporary"
            " directory, removed at stop.",
            show_default=False,
        ),
    ] = None,
    bin_dir: Annotated[
        Path | None,
        typer.Option(
            "--bin-dir",
            metavar="DIR",
            help="Look for nsqd/nsqlookupd/nats-server here first, before"
            " $NSQWORKER_TOOLS_BIN, PATH and ~/.local/share/nsqworker/bin.",
            show_default=False,
        ),
    ] = None,
    env_file: Annotated[
        Path | None,
        typer.Option(
            "--env-file",
            metavar="FILE",
            help="Also write the NSQWORKER_* variables to FILE (.env format: `nsqworker"
            " run --config FILE` reads it).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a local broker for development and print the settings to use it; Ctrl-C stops it.

    nsq: nsqd and nsqlookupd. nats: nats-server with JetStream.

    rabbitmq-stream: RabbitMQ 4.0 with the stream plugin (a root filesystem, run as root).

    Binaries are found as the test fixtures find them (docs/testing.md); a missing one
    is named, with the command that installs it.
    """
    # Until the broker is up, SIGTERM and SIGHUP interrupt like Ctrl-C: what was started
    # is then killed at exit (the helpers' atexit), never left running.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        local = start_broker(
            transport, standard_ports=not free_ports, data_dir=data_dir, bin_dir=bin_dir
        )
    except KeyboardInterrupt:
        _say("interrupted while starting; stopped")
        raise typer.Exit(130) from None
    except BrokerError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(EXIT_USAGE if transport not in TRANSPORTS else 1) from None
    except FileNotFoundError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(1) from None
    if env_file is not None:
        env_file.write_text("".join(f"{k}={v}\n" for k, v in local.env.items()))
    raise typer.Exit(_serve(local))


app.command("broker", cls=Command)(broker)
