"""NSQ's handshake without I/O: :class:`Negotiation` fed frames, checked step by step."""

from __future__ import annotations

import json
import ssl
import zlib

import pytest

from nsqworker.errors import AuthError, ConnectionClosed, NSQDError, RemoteProtocolError
from nsqworker.nsq import protocol
from nsqworker.nsq.handshake import Compress, Done, Negotiation, Send, Stage, StartTLS
from nsqworker.nsq.options import ConnectionConfig
from nsqworker.nsq.protocol import ErrorFrame, MessageFrame, Response

OK = Response(protocol.OK)


def identify_answer(**fields: object) -> Response:
    return Response(json.dumps({"max_rdy_count": 2500, **fields}).encode())


def negotiation(**config: object) -> Negotiation:
    return Negotiation("127.0.0.1:4150", "127.0.0.1", ConnectionConfig(**config))  # type: ignore[arg-type]


def test_start_sends_the_magic_and_identify() -> None:
    n = negotiation()
    [step] = n.start()
    assert isinstance(step, Send)
    assert step.data.startswith(protocol.MAGIC_V2 + b"IDENTIFY\n")
    body = json.loads(step.data[len(protocol.MAGIC_V2) + 13 :])
    assert body["feature_negotiation"] is True


def test_a_plain_answer_is_done_at_once() -> None:
    n = negotiation()
    n.start()
    [done] = n.receive(identify_answer(version="1.3.0"))
    assert isinstance(done, Done)
    assert done.server.max_rdy_count == 2500 and done.server.version == "1.3.0"
    assert n.stage is Stage.DONE
    with pytest.raises(RuntimeError, match="over"):
        n.receive(OK)


def test_heartbeats_are_answered_and_do_not_advance() -> None:
    n = negotiation()
    n.start()
    assert n.receive(Response(protocol.HEARTBEAT)) == [Send(protocol.nop())]
    assert n.stage is Stage.IDENTIFY


def test_tls_then_deflate_then_auth_in_nsqds_order() -> None:
    context = ssl.create_default_context()
    n = negotiation(tls_v1=True, ssl_context=context, compression="deflate", auth_secret="s3")
    n.start()
    [tls] = n.receive(
        identify_answer(tls_v1=True, deflate=True, deflate_level=3, auth_required=True)
    )
    assert tls == StartTLS(context, "127.0.0.1")
    [compress] = n.receive(OK)
    assert isinstance(compress, Compress)
    data = compress.compress(b"hello")
    assert zlib.decompressobj(-zlib.MAX_WBITS).decompress(data) == b"hello"
    [auth] = n.receive(OK)
    assert auth == Send(protocol.auth("s3"))
    [done] = n.receive(Response(b'{"identity": "me", "permission_count": 2}'))
    assert isinstance(done, Done)
    assert done.server.auth_identity == "me" and done.server.auth_permission_count == 2


def test_tls_asked_and_not_offered_is_refused() -> None:
    n = negotiation(tls_v1=True)
    n.start()
    with pytest.raises(ConnectionClosed, match="does not offer it"):
        n.receive(identify_answer(tls_v1=False))


def test_an_answer_other_than_ok_after_an_upgrade_closes() -> None:
    n = negotiation(compression="deflate")
    n.start()
    n.receive(identify_answer(deflate=True))
    with pytest.raises(ConnectionClosed, match="after compression"):
        n.receive(Response(b"NOPE"))


def test_auth_without_a_secret_or_over_plain_tcp_from_lookupd_is_not_sent() -> None:
    n = negotiation()
    n.start()
    with pytest.raises(AuthError, match="no secret"):
        n.receive(identify_answer(auth_required=True))
    n = negotiation(auth_secret="s3", auth_requires_tls=True)
    n.start()
    with pytest.raises(AuthError, match="plain TCP"):
        n.receive(identify_answer(auth_required=True))


def test_nsqds_errors_messages_and_garbage_raise() -> None:
    n = negotiation()
    n.start()
    with pytest.raises(NSQDError, match="E_BAD_BODY"):
        n.receive(ErrorFrame(b"E_BAD_BODY bad"))
    with pytest.raises(ConnectionClosed, match="before SUB"):
        n.receive(MessageFrame(0, 1, b"0" * 16, b"x"))
    with pytest.raises(RemoteProtocolError):
        n.receive(Response(b"{not json"))
    n = negotiation(auth_secret="s3")
    n.start()
    n.receive(identify_answer(auth_required=True))
    with pytest.raises(ConnectionClosed, match="answered AUTH"):
        n.receive(Response(b"[1]"))
