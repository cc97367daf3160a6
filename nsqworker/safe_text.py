"""Text from outside (a message body, a broker, an operator) made safe to print.

Dead-letter reasons, log fields and tables show text that a publisher, a broker or an
operator chose: a JSON key holding a newline, an ANSI escape, a right-to-left override.
:func:`one_line` escapes every such character, so the text prints as one line and
reaches a terminal as characters, never as commands to it. Only failure paths and
tables call this: never the message hot path.
"""

from __future__ import annotations

import re

__all__ = ["one_line"]

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidi
# overrides and isolates (which reorder what a terminal shows).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_PARTIAL_ESCAPE = re.compile(r"\\(x[0-9a-f]?|u[0-9a-f]{0,3})?$")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with control characters escaped (a newline as ``\\n``, ESC as ``\\x1b``),
    so that it prints as one line and as itself; cut to ``limit`` characters (then
    ending with ``...``) when given."""
    if limit is not None and len(text) > limit:  # cut first: escaping a huge text costs
        text = text[:limit]
        cut = True
    else:
        cut = False
    if not text.isprintable():  # the common case (plain text) pays one C-level scan
        text = _UNSAFE.sub(_escape, text)
    if limit is not None and (cut or len(text) > limit):
        return _PARTIAL_ESCAPE.sub("", text[: max(limit - 3, 0)]) + "..."
    return text
