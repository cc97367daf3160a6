"""A rogue nsqd for the trust tests: a real nsqd whose ``--auth-http-address`` is an
HTTP server of the test that grants every secret and records each one it is asked
about (what an attacker who got an nsqd listed by nsqlookupd would collect)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nsqworker.testing import NsqdFactory, NsqdProcess, NsqlookupdProcess, wait_for
from tests.json_server import json_server

SECRET = "the-operators-secret"


class AuthRecorder:
    """nsqd's auth server (``GET /auth?secret=&tls=``): grants everything, keeps each
    query in ``calls``; ``address`` is ``host:port`` for ``--auth-http-address``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, list[str]]] = []
        self.address = ""

    @property
    def secrets(self) -> list[str]:
        """Every secret nsqd was given, in order."""
        return [c.get("secret", [""])[0] for c in self.calls]

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        self.calls.append(query)
        allowed = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]
        return 200, {"ttl": 3600, "identity": "anyone", "authorizations": allowed}


@contextmanager
def auth_recorder() -> Iterator[AuthRecorder]:
    """A running :class:`AuthRecorder`, shut down at the end of the block."""
    recorder = AuthRecorder()
    with json_server(recorder.answer) as address:
        recorder.address = address
        yield recorder


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
