"""An nsqd that sends message ids of its own making (issue 41): such a delivery is
dead-lettered on arrival, its id shown escaped, and never reaches a handler. The nsqd is
real; a proxy in front of it rewrites the ids of the first messages it delivers."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.testing.faults import TcpProxy
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration

HOSTILE = [b"../../etc/passwd", b"[/]\x1b[31m\xff\xfeabcdef"]  # 16 bytes each


class IdRewriter(TcpProxy):
    """Forwards to nsqd; the message frames nsqd sends get the ids of HOSTILE, in turn."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.ids = list(HOSTILE)
        self.ids_lock = threading.Lock()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target, timeout=5)
        upstream.settimeout(None)
        self._track(upstream)
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._frames, args=(upstream, client), daemon=True).start()

    def _frames(self, src: socket.socket, dst: socket.socket) -> None:
        buffer = b""
        try:
            while data := src.recv(65536):
                buffer += data
                out = b""
                while len(buffer) >= 8:
                    (size,) = struct.unpack(">i", buffer[:4])
                    if len(buffer) < 4 + size:
                        break
                    frame, buffer = bytearray(buffer[: 4 + size]), buffer[4 + size :]
                    if struct.unpack(">i", frame[4:8])[0] == 2:  # a message: the id at 18
                        with self.ids_lock:
                            if self.ids:
                                frame[18:34] = self.ids.pop(0)
                    out += frame
                dst.sendall(out)
        except OSError:
            pass


async def test_a_message_id_nsqd_would_not_send_is_dead_lettered_on_arrival(
    nsqd: NsqdProcess,
) -> None:
    registry = Registry()
    handled: list[str] = []
    letters: list[tuple[str, str]] = []

    def on_dead_letter(msg: Message, reason: str) -> None:
        letters.append((msg.id, reason))

    @registry.task("ids", channel="c", on_dead_letter=on_dead_letter)
    async def handle(msg: Message) -> None:
        handled.append(msg.id)

    nsqd.create_channel("ids", "c")
    with IdRewriter(nsqd.tcp_address) as proxy:
        settings = Settings(nsqd_tcp_addresses=[proxy.address], output_buffer_size=-1)
        async with Worker(registry, settings):
            for body in ("one", "two", "three"):
                nsqd.publish("ids", body.encode())
            await wait_until(
                lambda: len(letters) == 2 and handled, timeout=20, message="2 refused, 1 handled"
            )
    assert len(handled) == 1 and handled[0].isalnum() and len(handled[0]) == 16
    assert letters == [
        ("../../etc/passwd", "nsqd sent a message id that is not 16 ASCII letters and digits: "
            "b'../../etc/passwd'"),
        ("[/]\\x1b[31m\\xff\\xfeabcdef", "nsqd sent a message id that is not 16 ASCII letters "
            "and digits: b'[/]\\x1b[31m\\xff\\xfeabcdef'"),
    ]  # fmt: skip


def test_message_id_never_raises_and_shows_what_is_not_text_escaped() -> None:
    assert Message(b"0123456789abcdef", b"", 0, 1, "t", "c", "a:1").id == "0123456789abcdef"
    odd = Message(b"\xff\n\x1b[2Jx", b"", 0, 1, "t", "c", "a:1")
    assert odd.id == "\\xff\\n\\x1b[2Jx"
