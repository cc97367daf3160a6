"""The dead-letter tools follow the worker's trust rules on NSQ (docs/security.md): the
AUTH secret goes to an nsqd of ``nsqd_tcp_addresses``, and to one nsqlookupd lists only
over TLS. The rogue here is a real nsqd, registered in a real nsqlookupd, whose auth
server records every secret it is asked about."""

from __future__ import annotations

from nsqworker.admin import list_dead_letters
from nsqworker.admin.nsq_store import CHANNEL
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, NsqlookupdProcess, make_message
from tests.nsq_rogue import SECRET, auth_nsqd, auth_recorder, listed_for

DEAD = "orders.dead"


async def test_a_listing_through_lookupd_sends_no_secret_to_a_listed_nsqd_over_plain_tcp(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    with auth_recorder() as recorder:
        rogue = auth_nsqd(nsqd_factory, recorder, nsqlookupd)
        rogue.create_channel(DEAD, CHANNEL)  # it looks like a place dead letters are kept
        listed_for(nsqlookupd, DEAD, rogue)
        settings = Settings(lookupd_http_addresses=[nsqlookupd.http_address],
                            auth_secret=SECRET, log_level="warning")  # fmt: skip
        notes: list[str] = []
        letters = await list_dead_letters(settings, DEAD, on_note=notes.append)
        assert recorder.secrets == []  # the rogue never saw the secret
    assert letters == []
    (note,) = [n for n in notes if rogue.tcp_address in n]
    assert "not read" in note and "lookupd_auth_without_tls" in note


async def test_a_trusted_nsqd_gets_auth_and_a_rogue_lookupd_lists_beside_it_does_not(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    with auth_recorder() as trusted_auth, auth_recorder() as rogue_auth:
        trusted = auth_nsqd(nsqd_factory, trusted_auth, nsqlookupd)
        rogue = auth_nsqd(nsqd_factory, rogue_auth, nsqlookupd)
        for nsqd in (trusted, rogue):
            nsqd.create_channel(DEAD, CHANNEL)
            listed_for(nsqlookupd, DEAD, nsqd)
        trusted.publish(DEAD, dead_letter_envelope(make_message(b"kept", topic="orders"), "r", "t"))
        # The worker's settings: this nsqd given directly (its HTTP API known through
        # lookupd), and lookupd, which lists the rogue too.
        settings = Settings(nsqd_tcp_addresses=[trusted.tcp_address],
                            lookupd_http_addresses=[nsqlookupd.http_address],
                            auth_secret=SECRET, log_level="warning")  # fmt: skip
        notes: list[str] = []
        letters = await list_dead_letters(settings, DEAD, on_note=notes.append)
        assert [d.body for d in letters] == [b"kept"]
        assert trusted_auth.secrets and set(trusted_auth.secrets) == {SECRET}
        assert rogue_auth.secrets == []
    (note,) = [n for n in notes if rogue.tcp_address in n]  # it was considered and refused
    assert "lookupd_auth_without_tls" in note
