"""The NSQ source's consumer on the driver: messages held in flight until Spark commits.

NSQ has no offsets, so the source's offsets count the messages this consumer received
(``{"session": <this process>, "n": <count>}``). It subscribes to the topic's channel on
each nsqd with ``RDY`` = the messages it may hold, keeps each message it receives,
TOUCHes the held ones every half message timeout, and FINs those below a batch's end
only when Spark commits that batch. A query that stops REQs what it holds; a driver that
dies leaves its messages in flight, and nsqd delivers them again once its message
timeout (``msg_timeout``) passes: at least once, duplicates only from the batch the
crash interrupted.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsqworker.errors import NoConnection
from nsqworker.logging import get_logger
from nsqworker.nsq import protocol

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["HeldConsumer", "HeldMessage"]

log = get_logger("nsqworker.spark.streaming")


@dataclass(frozen=True)
class HeldMessage:
    """A message received and not yet FINed: ``n`` counts from 0 in this process."""

    n: int
    id: str
    body: bytes
    timestamp_ns: int
    attempts: int
    address: str


class _Link:
    """One nsqd connection: a reader thread, writes under a lock."""

    def __init__(self, address: str, sock: socket.socket, decoder: protocol.Decoder) -> None:
        self.address = address
        self.sock = sock
        self.decoder = decoder
        self.lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)


class HeldConsumer:
    """Subscribes to ``topic``/``channel`` on ``addresses``, holding up to ``hold``
    messages per connection until :meth:`finish` is called for them."""

    def __init__(self, settings: Settings, addresses: list[str], topic: str, channel: str,
                 hold: int) -> None:  # fmt: skip
        self.settings, self.topic, self.channel, self.hold = settings, topic, channel, hold
        self.held: dict[int, HeldMessage] = {}
        self.received = 0
        self.error: Exception | None = None
        self._cond = threading.Condition()
        self._links: dict[str, _Link] = {}
        self._closed = False
        self.msg_timeout = 60.0
        """nsqd's message timeout (seconds), from its IDENTIFY answer."""
        for address in addresses:
            self._links[address] = self._connect(address)
        for link in self._links.values():
            threading.Thread(target=self._read, args=(link,), daemon=True,
                             name=f"nsq-held {link.address}").start()  # fmt: skip
        threading.Thread(target=self._touch_loop, daemon=True, name="nsq-held touch").start()

    def _connect(self, address: str) -> _Link:
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=10)
        except OSError as exc:
            raise NoConnection(f"nsqd at {address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        decoder = protocol.Decoder()
        sock.sendall(protocol.MAGIC_V2)
        sock.sendall(protocol.identify({
            "client_id": self.settings.client_id, "hostname": socket.gethostname(),
            "feature_negotiation": True, "user_agent": "nsqworker-spark",
            "heartbeat_interval": int(self.settings.heartbeat_interval * 1000),
        } | ({} if self.settings.msg_timeout is None
             else {"msg_timeout": int(self.settings.msg_timeout * 1000)})))  # fmt: skip
        answer = json.loads(self._response(sock, decoder, address))
        limit = int(answer.get("max_rdy_count", self.hold))
        self.msg_timeout = min(self.msg_timeout, answer.get("msg_timeout", 60_000) / 1000)
        if self.settings.auth_secret is not None:
            sock.sendall(protocol.auth(self.settings.auth_secret.get_secret_value()))
            self._response(sock, decoder, address)
        sock.sendall(protocol.sub(self.topic, self.channel))
        self._response(sock, decoder, address)
        sock.sendall(protocol.rdy(min(self.hold, limit), limit))
        sock.settimeout(None)
        return _Link(address, sock, decoder)

    @staticmethod
    def _response(sock: socket.socket, decoder: protocol.Decoder, address: str) -> bytes:
        while True:
            for frame in decoder.feed(sock.recv(65536) or b""):
                if isinstance(frame, protocol.ErrorFrame):
                    raise NoConnection(f"nsqd at {address}: {frame.data.decode(errors='replace')}")
                if isinstance(frame, protocol.Response) and frame.data != b"_heartbeat_":
                    return frame.data

    def _read(self, link: _Link) -> None:
        decoder = link.decoder
        try:
            while not self._closed:
                data = link.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("nsqd closed the connection")
                for frame in decoder.feed(data):
                    if isinstance(frame, protocol.MessageFrame):
                        self._keep(frame, link.address)
                    elif isinstance(frame, protocol.Response) and frame.data == b"_heartbeat_":
                        link.send(protocol.nop())
                    elif isinstance(frame, protocol.ErrorFrame):
                        log.warning(
                            "nsqd error",
                            nsqd=link.address,
                            error=frame.data.decode(errors="replace"),
                        )
        except Exception as exc:  # the source reports it at the next latestOffset
            if not self._closed:
                with self._cond:
                    self.error = exc

    def _keep(self, frame: protocol.MessageFrame, address: str) -> None:
        with self._cond:
            n = self.received
            self.received += 1
            self.held[n] = HeldMessage(n, frame.id.decode(), frame.body, frame.timestamp,
                                       frame.attempts, address)  # fmt: skip
            self._cond.notify_all()

    def messages(self, start: int, end: int) -> list[HeldMessage]:
        """The held messages numbered ``[start, end)``."""
        with self._cond:
            return [self.held[n] for n in range(start, end) if n in self.held]

    def finish(self, end: int) -> int:
        """FIN every held message numbered below ``end``; how many."""
        with self._cond:
            done = [m for n, m in self.held.items() if n < end]
            for m in done:
                del self.held[m.n]
        for m in done:
            self._links[m.address].send(protocol.fin(m.id.encode()))
        return len(done)

    def _touch_loop(self) -> None:
        every = max(self.msg_timeout / 2, 0.5)
        while not self._closed:
            time.sleep(every)
            with self._cond:
                held = list(self.held.values())
            try:
                for m in held:
                    self._links[m.address].send(protocol.touch(m.id.encode()))
            except OSError:
                pass  # the reader thread reports the broken connection

    def close(self) -> None:
        """REQ every message still held (nsqd delivers them again at once), then close
        the connections. A driver that dies instead leaves them to nsqd's message
        timeout."""
        for link in self._links.values():  # no more, then what was already on the wire
            try:
                link.send(protocol.rdy(0))
            except OSError:
                pass
        deadline, last = time.monotonic() + 1.0, -1
        while time.monotonic() < deadline and last != self.received:
            last = self.received
            time.sleep(0.1)
        with self._cond:
            held, self.held = list(self.held.values()), {}
        for m in held:
            try:
                self._links[m.address].send(protocol.req(m.id.encode(), 0))
            except OSError:
                pass
        self._closed = True
        for link in self._links.values():
            try:
                link.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread's recv
            except OSError:
                pass
            link.sock.close()
