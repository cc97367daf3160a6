"""A small HTTP server on 127.0.0.1 that answers every GET with JSON, for tests that
play a peer of ours: nsqd's auth server (``--auth-http-address``), say."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: ``answer(path, query) -> (status, document)`` for each GET.
Answer = Callable[[str, dict[str, list[str]]], tuple[int, Any]]


@contextmanager
def json_server(answer: Answer) -> Iterator[str]:
    """Serve ``answer`` until the block ends; yields ``host:port``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            status, doc = answer(url.path, urllib.parse.parse_qs(url.query))
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
