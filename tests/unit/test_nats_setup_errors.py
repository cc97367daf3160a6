"""NATS, without a server: which JetStream API failures mean "JetStream is off" (issue 40)."""

from __future__ import annotations

from nsqworker.nats.jetstream import jetstream_off
from nsqworker.settings import Settings


def test_no_responders_and_a_bare_503_mean_jetstream_is_off() -> None:
    from nats.errors import NoRespondersError
    from nats.js.errors import APIError, ServiceUnavailableError

    settings = Settings(transport="nats", nats_servers=["nats://10.0.0.5:4222"])
    for exc in (NoRespondersError(), ServiceUnavailableError(code=503)):
        error = jetstream_off(exc, settings)
        assert error is not None and str(error) == (
            "JetStream is not enabled on the NATS server at nats://10.0.0.5:4222: start"
            " nats-server with -js (--jetstream), or add `jetstream {}` to its configuration"
            " file"
        )
    account = APIError(code=503, err_code=10039, description="jetstream not enabled for account")
    assert "not enabled for this account" in str(jetstream_off(account, settings))
    # A cluster electing its leader answers 503 with an error code: not "off", retried.
    electing = ServiceUnavailableError(code=503, err_code=10008, description="temporarily")
    assert jetstream_off(electing, settings) is None
