"""``nsqworker inflight``: what a running ``nsqworker run`` is doing right now.

Reads ``/inflight`` from the supervisor's health server and prints a table, oldest
first: each message a handler is still running (an ``async def`` handler that awaited,
or a plain one in its thread) or that waits for a slot, with its task, id, attempts and
age. Handlers that finish without awaiting never show: they are done within the read.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from nsqworker.cli.common import EXIT_USAGE, AsJson, table_console
from nsqworker.cli.safe import cell, markup_safe
from nsqworker.safe_text import one_line

__all__ = ["inflight"]


def inflight(
    url: Annotated[
        str,
        typer.Option(
            "--url",
            metavar="URL",
            help="The health server of `nsqworker run` (its health_port).",
        ),
    ] = "http://127.0.0.1:8080",
    as_json: AsJson = False,
) -> None:
    """Show what the workers of a running `nsqworker run` are handling now, oldest first."""
    import httpx

    address = url.rstrip("/") + "/inflight"
    try:
        response = httpx.get(address, timeout=5.0, trust_env=False)
        response.raise_for_status()
        rows: list[dict[str, Any]] = [
            row for row in response.json().get("inflight") or [] if isinstance(row, dict)
        ]
    except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
        typer.echo(
            f"error: cannot read {address} ({one_line(str(exc))}); is `nsqworker run` serving "
            "health on "
            "that port? pass --url http://HOST:PORT",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE) from None
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"{len(rows)} in flight at {markup_safe(url)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for column, justify in (
        ("age", "right"), ("worker", "right"), ("task", "left"), ("id", "left"),
        ("attempts", "right"), ("state", "left"), ("handler", "left"),
    ):  # fmt: skip
        table.add_column(column, justify=justify, no_wrap=column != "handler")  # type: ignore[arg-type]
    for row in rows:  # every cell is what the server sent, shown as text (cli/safe.py)
        table.add_row(
            cell(_age(row.get("age_s"))), cell(row.get("worker", "-")),
            cell(row.get("task", "?")), cell(row.get("id", "?")), cell(row.get("attempts", "?")),
            cell(row.get("state", "?")), cell(row.get("handler", "-")),
        )  # fmt: skip
    table_console().print(table)


def _age(value: Any) -> str:
    """Seconds as ``12.3s``; what is not a number, as it was sent."""
    try:
        return f"{float(value or 0):.1f}s"
    except (TypeError, ValueError):
        return str(value)
