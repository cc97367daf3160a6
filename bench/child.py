"""Entry point of every measured Python process.

``python -m bench.child MODULE:FUNCTION 'JSON'`` imports ``bench.clients.MODULE``, calls
``FUNCTION(params)`` and prints its result dict as the last line (see
:func:`bench.common.emit_result`). Only that module is imported, so an nsqworker
client never pays for tornado and pynsq never for nsqworker.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from collections.abc import Sequence

from bench.common import emit_result


def main(argv: Sequence[str]) -> int:
    target, raw = argv[0], argv[1] if len(argv) > 1 else "{}"
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(f"bench.clients.{module_name}"), function_name)
    try:
        result = function(json.loads(raw))
    except Exception as exc:
        traceback.print_exc()
        emit_result({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
