"""Each broker's page says how to get that broker, for development and in production
(issue 39: rabbitmq-streams.md said only "needs RabbitMQ 4.0+ with the stream plugin", and
nothing said a nats-server needs JetStream)."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Per page: the dev command, and what the production routes must name.
PAGES = {
    "getting-started.md": ("nsqworker dev broker\n", ["nsqio/nsq", "--broadcast-address"]),
    "nats.md": (
        "nsqworker dev broker --transport nats",
        [
            "nats-server -js",
            "nats:2 -js",
            "helm install nats nats/nats",
            "config.jetstream.enabled=true",
        ],
    ),
    "rabbitmq-streams.md": (
        "nsqworker dev broker --transport rabbitmq-stream",
        [
            "kind: RabbitmqCluster",
            "additionalPlugins:\n      - rabbitmq_stream",
            "rabbitmq-plugins enable rabbitmq_stream",
            "debootstrap --variant=minbase",
        ],
    ),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_gives_the_dev_broker_and_the_production_routes(page: str) -> None:
    text = (DOCS / page).read_text()
    command, routes = PAGES[page]
    assert f"$ {command}" in text or f"$ sudo {command}" in text
    for route in routes:
        assert route in text, f"{page} does not give {route!r}"
    assert "not tested here" in text
