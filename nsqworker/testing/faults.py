"""Broken peers for fault-injection tests: a TCP proxy that can stop forwarding, TCP
servers that misbehave during the handshake, and an HTTP server (an nsqlookupd stand-in)
that answers 500, garbage or slowly.

Each runs in daemon threads on 127.0.0.1, works as a context manager, and needs no
event loop, so it serves asyncio code under test from the same process::

    with TcpProxy(nsqd.tcp_address) as proxy:       # the worker dials proxy.address
        ...
        proxy.pause()     # a partition: bytes stop flowing, sockets stay open
        proxy.resume()

    with SilentServer() as silent:                  # accepts, never answers: IDENTIFY
        ...                                         # times out
    with MagicCloser() as closer:                   # closes right after the magic
        ...
    with AuthAskingServer() as impostor:            # asks for AUTH, records the bytes
        ...
    with HttpFaultServer(upstream=lookupd.http_address) as lookupd_proxy:
        lookupd_proxy.mode = "500"                  # "ok", "500", "garbage", "slow", "fixed"
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

__all__ = ["AuthAskingServer", "HttpFaultServer", "MagicCloser", "SilentServer", "TcpProxy"]

LOOPBACK = "127.0.0.1"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or LOOPBACK, int(port)


class _TcpServer:
    """A listening socket on a free loopback port and a thread that accepts."""

    def __init__(self) -> None:
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.accepted = 0
        """Connections accepted so far."""
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    @property
    def address(self) -> str:
        """``127.0.0.1:port``, for ``nsqd_tcp_addresses``."""
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        """Start accepting."""
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._track(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SilentServer(_TcpServer):
    """Accepts TCP connections, reads whatever comes, never answers."""

    def _serve(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while client.recv(65536):
                pass


class AuthAskingServer(_TcpServer):
    """An nsqd impostor: answers IDENTIFY with ``auth_required: true`` and keeps every
    byte a client sends in ``received`` (where an AUTH secret would show)."""

    def __init__(self) -> None:
        super().__init__()
        self.received = bytearray()

    def _serve(self, client: socket.socket) -> None:
        answer = b'{"auth_required":true,"max_rdy_count":2500,"version":"1.3.0"}'
        frame = (len(answer) + 4).to_bytes(4, "big") + b"\0\0\0\0" + answer
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    self.received += data
                if b"IDENTIFY" in data:
                    client.sendall(frame)


class MagicCloser(_TcpServer):
    """Accepts, reads the 4-byte protocol magic, and closes the connection."""

    def _serve(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            got = b""
            while len(got) < 4:
                chunk = client.recv(4 - len(got))
                if not chunk:
                    break
                got += chunk
            client.close()


class TcpProxy(_TcpServer):
    """Forwards every connection to ``target`` (``host:port``) until told otherwise.

    :meth:`pause` stops forwarding in both directions without closing anything (a
    network partition: the peers see silence, not a reset); :meth:`resume` lets the held
    bytes through. :meth:`drop` resets every connection open now.
    """

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = _split(target)
        self._flowing = threading.Event()
        self._flowing.set()

    def pause(self) -> None:
        """Stop forwarding; sockets stay open and new connections are accepted."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, held bytes first."""
        self._flowing.set()

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return not self._flowing.is_set()

    def drop(self) -> None:
        """Reset every connection open now (the listener stays)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                sock.close()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._track(upstream)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while not self._flowing.wait(0.05):
                    if self._closed.is_set():
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


Mode = Literal["ok", "500", "garbage", "slow", "fixed"]


class HttpFaultServer:
    """An HTTP server standing in for nsqlookupd (or nsqd's HTTP API).

    ``mode`` decides every answer and may be changed at any time: ``"ok"`` forwards the
    request to ``upstream`` (``http://host:port``) and returns its answer (404 without
    an upstream), ``"500"`` answers 500, ``"garbage"`` answers 200 with a body that is
    not JSON, ``"slow"`` waits ``delay`` seconds before answering like ``"ok"``,
    ``"fixed"`` answers 200 with ``body`` (a hostile lookupd's answer, say).
    ``requests`` counts what it was asked.
    """

    def __init__(self, upstream: str | None = None, mode: Mode = "ok", delay: float = 30.0):
        self.upstream = upstream.rstrip("/") if upstream else None
        self.mode: Mode = mode
        self.delay = delay
        self.body = b""
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                owner.answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        """``http://127.0.0.1:port``, for ``lookupd_http_addresses``."""
        return f"http://{LOOPBACK}:{self.port}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        """Answer one GET as :attr:`mode` says (its request handler calls this)."""
        mode = self.mode
        if mode == "500":
            self._send(handler, 500, b'{"message":"INTERNAL_ERROR"}')
        elif mode == "garbage":
            self._send(handler, 200, b"<html>this is not JSON</html>")
        elif mode == "fixed":
            self._send(handler, 200, self.body)
        else:
            if mode == "slow":
                time.sleep(self.delay)
            self._send(handler, *self._forward(handler.path))

    def _forward(self, path: str) -> tuple[int, bytes]:
        if self.upstream is None:
            return 404, b'{"message":"TOPIC_NOT_FOUND"}'
        try:
            with urllib.request.urlopen(self.upstream + path, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 502, b'{"message":"upstream unreachable"}'

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        with contextlib.suppress(OSError):
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)

    def start(self) -> Self:
        """Start serving."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
