"""Text that a broker, a worker or an operator supplied, made safe for rich to print.

rich reads ``[...]`` in a string as markup: an id ``[/]aaaa`` read from ``/inflight``
would raise ``MarkupError``, ``[red]`` would restyle the table, and an escape sequence
would reach the terminal. Table cells are :func:`cell` (a ``Text``: never markup); text
put inside a markup string is :func:`markup_safe`. Both escape control characters
(:func:`nsqworker.safe_text.one_line`). rich is imported when called, so commands that
print nothing through it do not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqworker.safe_text import one_line

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["cell", "markup_safe"]


def cell(value: object, style: str = "") -> Text:
    """``value`` as a table cell: its text as is, one line, never read as markup."""
    from rich.text import Text

    return Text(one_line(str(value)), style=style)


def markup_safe(value: object) -> str:
    """``value`` as text inside a rich markup string: one line, its ``[`` escaped."""
    from rich.markup import escape

    return escape(one_line(str(value)))
