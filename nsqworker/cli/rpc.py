"""``nsqworker rpc call``: call an RPC endpoint and print its answer as JSON.

``nsqworker rpc call pricing '{"sku": "A1"}' --timeout 5`` prints the response on
standard output (bytes as base64 with ``--encoding binary``); errors go to standard
error. Exit codes: 0 answered, 1 the endpoint raised (``RpcError``), 3 no answer in
time, 4 nsqd unreachable or another failure, 2 bad arguments.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from nsqworker.cli.common import EXIT_USAGE, Command, ConfigFile, Group, NsqdOption, load_settings
from nsqworker.cli.publish import _quiet_library_logs
from nsqworker.cli.safe import markup_safe

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["app", "call", "call_command"]

EXIT_RPC_ERROR = 1
EXIT_TIMEOUT = 3
EXIT_FAILED = 4

app = typer.Typer(
    name="rpc",
    cls=Group,
    help="Call RPC endpoints over NSQ (docs/rpc.md).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@app.command(cls=Command)
def call(
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The endpoint's topic.")],
    request: Annotated[
        str,
        typer.Argument(
            metavar="REQUEST",
            help="The request as JSON ('-' reads it from stdin); with --encoding binary, "
            "the raw text.",
        ),
    ] = "{}",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 5.0,
    encoding: Annotated[
        str, typer.Option(help="json, msgpack or binary: how the request travels.")
    ] = "json",
    nsqd: NsqdOption = None,
    lookupd: Annotated[
        list[str] | None,
        typer.Option(
            "--lookupd",
            metavar="URL",
            help="nsqlookupd HTTP address (http://host:port), instead of --nsqd.",
        ),
    ] = None,
    nsqd_http: Annotated[
        str | None,
        typer.Option(
            "--nsqd-http",
            metavar="HOST:PORT",
            help="The reply nsqd's HTTP address, to delete the reply topic at the end.",
        ),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Call the endpoint on TOPIC with REQUEST and print its answer as JSON."""
    settings = load_settings(config)
    code = call_command(
        topic,
        request,
        timeout=timeout,
        encoding=encoding,
        nsqd=list(nsqd or []),
        lookupd=list(lookupd or []),
        nsqd_http=nsqd_http,
        settings=settings,
    )
    raise typer.Exit(code)


def call_command(
    topic: str,
    request: str,
    *,
    timeout: float = 5.0,
    encoding: str = "json",
    nsqd: list[str] | None = None,
    lookupd: list[str] | None = None,
    nsqd_http: str | None = None,
    settings: Any = None,
    stdin: IO[str] = sys.stdin,
    out: IO[str] = sys.stdout,
    console: Console | None = None,
) -> int:
    """Run one call; print the answer to ``out`` and errors to ``console``; return the
    exit code (see the module)."""
    from nsqworker.errors import NSQWorkerError, RpcError, RpcTimeout
    from nsqworker.nsq.protocol import check_topic
    from nsqworker.rpc import codec
    from nsqworker.rpc.client import RpcClient

    def fail(code: int, text: str) -> int:
        # rich only on failure: an answered call does not pay for importing it
        from rich.console import Console

        # a remote endpoint's or a broker's text: its lines as text, never markup
        shown = "\n".join(markup_safe(line) for line in text.splitlines())
        (console or Console(stderr=True)).print(
            f"[red]error:[/red] {shown}", highlight=False, soft_wrap=True
        )
        return code

    text = stdin.read() if request == "-" else request
    if not (nsqd or lookupd or getattr(settings, "nsqd_tcp_addresses", None)) and not getattr(
        settings, "lookupd_http_addresses", None
    ):
        return fail(
            EXIT_USAGE,
            "no nsqd to call through: pass --nsqd HOST:PORT (like --nsqd 127.0.0.1:4150) or "
            "--lookupd URL, or set NSQWORKER_NSQD_TCP_ADDRESSES",
        )
    try:
        check_topic(topic)
        code = codec.encoding_code(encoding)
        value: Any = text.encode() if code == codec.BINARY else json.loads(text)
        client = RpcClient(
            nsqd or None,
            lookupd_http_addresses=lookupd or None,
            settings=settings,
            nsqd_http_address=nsqd_http,
            timeout=timeout,
            encoding=code,
        )
    except json.JSONDecodeError as exc:
        return fail(EXIT_USAGE, f"REQUEST is not JSON: {exc}")
    except (NSQWorkerError, ValueError) as exc:
        return fail(EXIT_USAGE, str(exc))

    async def run() -> Any:
        async with client:
            return await client.call(topic, value)

    try:
        with _quiet_library_logs():  # the one error line says it all
            answer = asyncio.run(run())
    except RpcError as exc:
        return fail(EXIT_RPC_ERROR, f"{topic} raised {exc.type}: {exc.message}")
    except RpcTimeout as exc:
        return fail(EXIT_TIMEOUT, str(exc))
    except (NSQWorkerError, OSError) as exc:
        return fail(EXIT_FAILED, " ".join(str(exc).split()) or type(exc).__name__)
    except KeyboardInterrupt:
        return 130
    print(json.dumps(answer, default=_bytes_as_base64, ensure_ascii=False), file=out)
    return 0


def _bytes_as_base64(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
