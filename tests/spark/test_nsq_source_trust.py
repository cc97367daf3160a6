"""The ``nsq`` Spark source connects as the worker does (docs/security.md): the AUTH
secret only to the settings' nsqd, to an nsqd nsqlookupd lists only over TLS, and
never in cleartext when TLS is asked for. Driven through the source's own reader
(``NsqSource(...).streamReader``), as Spark calls it, with real nsqd and nsqlookupd;
the rogue's auth server records every secret it is asked about."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trustme

from nsqworker.errors import NoConnection
from nsqworker.spark.streaming.nsq_source import NsqSource, NsqStreamReader
from nsqworker.testing import NsqdFactory, NsqlookupdProcess, wait_for
from tests.nsq_rogue import SECRET, auth_nsqd, auth_recorder, listed_for


def reader(topic: str) -> NsqStreamReader:
    """The source's reader, as Spark makes it (settings from the environment)."""
    return NsqSource({"topic": topic, "channel": "spark"}).streamReader(None)


def test_a_lookupd_listed_nsqd_gets_no_secret_over_plain_tcp(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"clicks{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("NSQWORKER_LOOKUPD_HTTP_ADDRESSES", nsqlookupd.http_address)
    monkeypatch.setenv("NSQWORKER_AUTH_SECRET", SECRET)
    with auth_recorder() as recorder:
        rogue = auth_nsqd(nsqd_factory, recorder, nsqlookupd)
        rogue.create_topic(topic)
        listed_for(nsqlookupd, topic, rogue)
        source = reader(topic)
        try:
            with pytest.raises(NoConnection, match="lookupd_auth_without_tls"):
                source.initialOffset()
        finally:
            source.stop()
        assert recorder.secrets == []


def test_a_trusted_nsqd_gets_auth_only_over_the_tls_asked_for(
    nsqd_factory: NsqdFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    cert, ca_file = ca.issue_cert("127.0.0.1"), tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(tmp_path / "cert.pem"), append=True)
    topic = f"clicks{uuid.uuid4().hex[:8]}"
    with auth_recorder() as recorder:
        tls = (f"--tls-cert={tmp_path / 'cert.pem'}", f"--tls-key={tmp_path / 'key.pem'}")
        nsqd = auth_nsqd(nsqd_factory, recorder, extra_args=tls)
        nsqd.create_channel(topic, "spark")
        nsqd.publish(topic, b"over tls")
        monkeypatch.setenv("NSQWORKER_NSQD_TCP_ADDRESSES", nsqd.tcp_address)
        monkeypatch.setenv("NSQWORKER_AUTH_SECRET", SECRET)
        monkeypatch.setenv("NSQWORKER_TLS_V1", "true")
        monkeypatch.setenv("NSQWORKER_TLS_CA_FILE", str(ca_file))
        source = reader(topic)
        try:
            source.initialOffset()
            wait_for(lambda: source.latestOffset()["n"] == 1, message="the message held")
        finally:
            source.stop()
        assert recorder.secrets == [SECRET]
        assert [c["tls"] for c in recorder.calls] == [["true"]]
    wait_for(lambda: nsqd.depth(topic, "spark") == 1, message="the message handed back")
