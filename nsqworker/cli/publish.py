"""``nsqworker publish``: one message from the command line, or one per line of stdin.

The typer command :func:`publish` parses the options and calls :func:`publish_command`,
which returns the exit code: 0 published, 1 the broker refused or could not be reached,
2 bad arguments or a broker set-up that cannot work (a refused login, JetStream off, a
missing vhost or stream, an advertised host that does not resolve), 130 interrupted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Annotated, Any, Final

import typer

from nsqworker.cli.common import NatsOption, NsqdOption, RabbitOption, TransportOption
from nsqworker.cli.safe import markup_safe
from nsqworker.errors import ConfigurationError, NSQWorkerError
from nsqworker.nsq import protocol

if TYPE_CHECKING:  # imported when a command runs, so that `nsqworker --version` is quick
    from rich.console import Console
    from rich.progress import Progress

    from nsqworker.nsq.producer import Producer

__all__ = ["publish", "publish_command"]

_LINGER: Final = 0.05  # seconds a partial batch waits for more lines from a slow pipe
_BLOCK: Final = 1 << 16


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
    nsqd: NsqdOption = None,
    transport: TransportOption = None,
    nats: NatsOption = None,
    rabbitmq: RabbitOption = None,
    delay: Annotated[
        float | None,
        typer.Option(
            help="Seconds before the broker delivers it (NSQ: DPUB; NATS: a scheduled"
            " message; not on RabbitMQ Streams)."
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="Lines per batch when reading stdin (one MPUB on NSQ).")
    ] = 100,
) -> None:
    """Publish one message, or one per line of stdin."""
    from nsqworker.child import configure_telemetry

    configure_telemetry()
    code = publish_command(
        topic, body, nsqd=list(nsqd or []), delay=delay, batch_size=batch_size,
        transport=transport, nats=list(nats or []), rabbitmq=rabbitmq,
    )  # fmt: skip
    raise typer.Exit(code)


def publish_command(
    topic: str,
    body: str | None,
    *,
    nsqd: list[str],
    delay: float | None,
    batch_size: int = 100,
    stdin: IO[Any] = sys.stdin,
    console: Console | None = None,
    timeout: float = 5.0,
    transport: str | None = None,
    nats: list[str] | None = None,
    rabbitmq: str | None = None,
) -> int:
    """Publish ``body`` to ``topic``, or each non-empty line of ``stdin`` when ``body``
    is None or ``"-"``; print a one-line summary or a one-line error; return the exit code.

    Lines go out with MPUB in batches of ``batch_size`` (as they arrive, so ``tail -f``
    works); with ``delay`` (seconds) every message is a DPUB instead. A progress bar
    shows on a terminal while stdin is a pipe or a file. With ``transport="nats"`` (or
    ``NSQWORKER_TRANSPORT=nats``) messages go to JetStream, each acknowledged by its
    stream, to ``nats`` servers or ``nats_servers``; with ``rabbitmq-stream``, to the
    stream ``topic`` at ``rabbitmq`` (a URI) or ``rabbitmq_stream_uri``, each confirmed.
    Output goes to ``console``
    (standard error by default), leaving standard output alone.
    """
    from rich.console import Console

    from nsqworker.nsq.producer import Producer
    from nsqworker.producing import producer_for
    from nsqworker.settings import Settings

    console = console or Console(stderr=True)
    try:
        settings = None
        if transport is not None or nats or rabbitmq or not nsqd:
            settings = Settings.load(
                None,
                override_names={
                    "transport": "--transport",
                    "nats_servers": "--nats",
                    "rabbitmq_stream_uri": "--rabbitmq",
                },
                transport=transport,
                nats_servers=nats or None,
                rabbitmq_stream_uri=rabbitmq,
            )
        other = settings is not None and settings.transport != "nsq"
        if other:  # the transport's own name rule (a NATS subject, a stream name)
            from nsqworker.transport import create_transport

            assert settings is not None
            create_transport(settings).check_topic(topic)
        else:
            protocol.check_topic(topic)
        if body == "":
            raise ConfigurationError("the message body is empty, and brokers refuse empty messages")
        if delay is not None and not other:  # other transports check their own delays
            from nsqworker.nsq.publishing import delay_to_ms

            delay_to_ms(delay)
        if batch_size < 1:
            raise ConfigurationError(f"--batch-size must be at least 1, got {batch_size}")
        if not other and settings is not None and not settings.nsqd_tcp_addresses:
            raise ConfigurationError(
                "no nsqd address: pass --nsqd HOST:PORT (like --nsqd 127.0.0.1:4150), "
                "or set NSQWORKER_NSQD_TCP_ADDRESSES"
            )
        if other:
            producer = producer_for(settings, timeout)
        else:
            producer = Producer(nsqd or None, settings=settings, timeout=timeout)
    except (ConfigurationError, TypeError) as exc:
        for line in str(exc).splitlines():  # a SettingsError has one line per problem
            console.print(f"[red]error:[/red] {markup_safe(line)}", highlight=False, soft_wrap=True)
        return 2
    run = _Run(topic, delay, console)
    try:
        with _quiet_library_logs():
            if body is not None and body != "-":
                asyncio.run(run.single(producer, body.encode()))
            else:
                asyncio.run(run.lines(producer, stdin, batch_size))
    except KeyboardInterrupt:
        console.print(f"interrupted after {run.count} messages", highlight=False, soft_wrap=True)
        return 130
    except ConfigurationError as exc:  # the broker's set-up: it cannot work as it is
        done = f" after {run.count} messages" if run.count else ""
        console.print(f"[red]error{done}:[/red] {_one_line(exc)}", highlight=False, soft_wrap=True)
        return 2
    except (NSQWorkerError, OSError) as exc:
        done = f" after {run.count} messages" if run.count else ""
        text = markup_safe(_one_line(exc))  # a broker's error text, never markup
        console.print(f"[red]error{done}:[/red] {text}", highlight=False, soft_wrap=True)
        return 1
    console.print(run.summary(), highlight=False, soft_wrap=True)
    return 0


@contextlib.contextmanager
def _quiet_library_logs() -> Iterator[None]:
    """Unless logging was set up, keep redial warnings out: the error line says it all."""
    logger = logging.getLogger("nsqworker")
    if logging.getLogger().handlers or logger.level != logging.NOTSET:
        yield
        return
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(logging.NOTSET)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class _Run:
    """One invocation: what was published so far, and how long it took."""

    def __init__(self, topic: str, delay: float | None, console: Console) -> None:
        self.topic = topic
        self.delay = delay
        self.console = console
        self.count = 0
        self.started = time.perf_counter()

    def summary(self) -> str:
        elapsed = time.perf_counter() - self.started
        noun = "message" if self.count == 1 else "messages"
        rate = f" ({self.count / elapsed:,.0f} msg/s)" if elapsed > 0 and self.count > 1 else ""
        delayed = f" delayed {self.delay:g} s" if self.delay is not None else ""
        return f"published {self.count:,} {noun}{delayed} to {self.topic} in {elapsed:.2f} s{rate}"

    async def single(self, producer: Producer, body: bytes) -> None:
        async with producer:
            await producer.publish(self.topic, body, delay=self.delay)
        self.count = 1

    async def lines(self, producer: Producer, stdin: IO[Any], batch_size: int) -> None:
        total = _regular_file_size(stdin)
        progress = _progress(self.console, stdin, total)
        task = progress.add_task("publishing", total=total)
        reader = _LineReader(stdin, asyncio.get_running_loop())
        self.started = time.perf_counter()
        async with producer:
            with progress:
                while (batch := await reader.batch(batch_size)) is not None:
                    await self._send(producer, batch)
                    self.count += len(batch)
                    progress.update(task, completed=reader.bytes_read if total else self.count)

    async def _send(self, producer: Producer, batch: list[bytes]) -> None:
        if self.delay is None:
            await producer.publish_many(self.topic, batch)
        else:
            await asyncio.gather(
                *(producer.publish(self.topic, b, delay=self.delay) for b in batch)
            )


class _LineReader:
    """Non-empty lines of stdin, read in blocks by a daemon thread (reads block)."""

    def __init__(self, stdin: IO[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=8)
        self.lines: collections.deque[bytes] = collections.deque()
        self.tail = b""
        self.eof = False
        self.bytes_read = 0
        thread = threading.Thread(
            target=self._read, args=(stdin, loop), name="nsqworker-publish-stdin", daemon=True
        )
        thread.start()

    def _read(self, stdin: IO[Any], loop: asyncio.AbstractEventLoop) -> None:
        def put(block: bytes | None) -> None:
            asyncio.run_coroutine_threadsafe(self.queue.put(block), loop).result()

        try:
            for block in _blocks(stdin):
                put(block)
        except Exception:  # stdin broke, or the loop is gone (the command ended early)
            pass
        try:
            put(None)
        except Exception:
            pass

    async def batch(self, size: int) -> list[bytes] | None:
        """Up to ``size`` lines, None at the end. Waits for the first line, then at most
        ``_LINGER`` seconds for more, so a slow pipe (``tail -f``) is not held back."""
        while len(self.lines) < size and not self.eof:
            try:
                block = await asyncio.wait_for(self.queue.get(), _LINGER if self.lines else None)
            except TimeoutError:
                break
            self._feed(block)
        if not self.lines:
            return None
        return [self.lines.popleft() for _ in range(min(size, len(self.lines)))]

    def _feed(self, block: bytes | None) -> None:
        if block is None:
            self.eof = True
            parts, self.tail = [self.tail], b""
        else:
            self.bytes_read += len(block)
            parts = (self.tail + block).split(b"\n")
            self.tail = parts.pop()
        self.lines.extend(line for part in parts if (line := part.rstrip(b"\r")))


def _blocks(stdin: IO[Any]) -> Iterator[bytes]:
    """stdin in blocks of what is there: ``os.read`` does not wait for a full block."""
    try:
        fd = stdin.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None
    if fd is not None:
        while block := os.read(fd, _BLOCK):
            yield block
        return
    while data := stdin.read(_BLOCK):
        yield data if isinstance(data, bytes) else data.encode("utf-8")


def _regular_file_size(stdin: IO[Any]) -> int | None:
    """Bytes in stdin when it is a regular file (``< file``), else None."""
    try:
        info = os.fstat(stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) and info.st_size else None


def _progress(console: Console, stdin: IO[Any], total: int | None) -> Progress:
    """A transient progress bar; shown only on a terminal while stdin is not one."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    interactive = bool(getattr(stdin, "isatty", lambda: False)())
    columns = (
        [BarColumn(), TextColumn("{task.percentage:>3.0f}%")]
        if total
        else [SpinnerColumn(), MofNCompleteColumn()]
    )
    return Progress(
        TextColumn("[bold]{task.description}"),
        *columns,
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=interactive or not console.is_terminal,
    )
