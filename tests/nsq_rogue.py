"""A rogue nsqd for the trust tests: a real nsqd whose ``--auth-http-address`` is an
HTTP server of the test that grants every secret and records each one it is asked
about (what an attacker who got an nsqd listed by nsqlookupd would collect)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nsqworker.testing import NsqdFactory, NsqdProcess, NsqlookupdProcess, wait_for

SECRET = "the-operators-secret"


class AuthRecorder(http.server.HTTPServer):
    """nsqd's auth server (``GET /auth?secret=&tls=``): grants everything, keeps each
    query in ``calls``."""

    calls: list[dict[str, list[str]]]

    @property
    def address(self) -> str:
        """``host:port`` for nsqd's ``--auth-http-address``."""
        return f"127.0.0.1:{self.server_address[1]}"

    @property
    def secrets(self) -> list[str]:
        """Every secret nsqd was given, in order."""
        return [c.get("secret", [""])[0] for c in self.calls]


class _Grant(http.server.BaseHTTPRequestHandler):
    server: AuthRecorder

    def do_GET(self) -> None:
        self.server.calls.append(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query))
        allowed = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]
        body = json.dumps({"ttl": 3600, "identity": "anyone", "authorizations": allowed}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def auth_recorder() -> Iterator[AuthRecorder]:
    """A running :class:`AuthRecorder`, shut down at the end of the block."""
    server = AuthRecorder(("127.0.0.1", 0), _Grant)
    server.calls = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def auth_nsqd(
    factory: NsqdFactory, recorder: AuthRecorder, lookupd: NsqlookupdProcess | None = None,
    extra_args: tuple[str, ...] = (),
) -> NsqdProcess:  # fmt: skip
    """A real nsqd that asks for AUTH and checks secrets with ``recorder``."""
    args = (f"--auth-http-address={recorder.address}", *extra_args)
    return factory(lookupd, extra_args=args) if lookupd else factory(extra_args=args)


def listed_for(lookupd: NsqlookupdProcess, topic: str, nsqd: NsqdProcess) -> None:
    """Wait until nsqlookupd lists ``nsqd`` among the producers of ``topic``."""

    def listed() -> bool:
        return any(p.get("tcp_port") == nsqd.tcp_port for p in lookupd.lookup(topic))

    wait_for(listed, timeout=15, message=f"nsqlookupd listing {nsqd.tcp_address} for {topic}")
