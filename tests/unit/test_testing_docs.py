"""docs/testing.md lists every fixture of the ``nsqworker.testing`` plugin, and each
attribute it names (``nats_server.url``...) exists on what the fixture gives (issue 39:
``nats_server.url`` was found by reading the source)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nsqworker.testing
import nsqworker.testing.kube
import nsqworker.testing.kube_cluster_plugin
import nsqworker.testing.postgres
from nsqworker.testing import NsqBinaries, NsqCluster, NsqdProcess, NsqlookupdProcess
from nsqworker.testing.kube import KubeControlPlane
from nsqworker.testing.kube_cluster import KubeCluster
from nsqworker.testing.nats import NatsCluster, NatsServerProcess
from nsqworker.testing.postgres import PostgresProcess
from nsqworker.testing.rabbitmq import RabbitMQProcess

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
#: What each fixture gives, for the attributes the page names.
GIVES: dict[str, type] = {
    "nsqd": NsqdProcess,
    "nsqlookupd": NsqlookupdProcess,
    "nsq_cluster": NsqCluster,
    "nsq_binaries": NsqBinaries,
    "nats_server": NatsServerProcess,
    "nats_cluster": NatsCluster,
    "rabbitmq_server": RabbitMQProcess,
    "kube_control_plane": KubeControlPlane,
    "kube_cluster": KubeCluster,
    "postgres": PostgresProcess,
}


def plugin_fixtures() -> set[str]:
    names = set()
    for module in (
        nsqworker.testing,
        nsqworker.testing.kube,
        nsqworker.testing.kube_cluster_plugin,
        nsqworker.testing.postgres,
    ):
        for value in vars(module).values():
            if type(value).__name__ == "FixtureFunctionDefinition":
                names.add(value.name)
    return names


def fixture_table() -> dict[str, str]:
    """Each row of the page's fixture table: the fixture's name, and the whole row."""
    rows = re.findall(r"^\| `(\w+)` \|(.*)$", PAGE.read_text(), re.M)
    return dict(rows)


def test_every_fixture_of_the_plugin_is_in_the_table() -> None:
    fixtures = plugin_fixtures()
    assert {"nsqd", "nats_server", "rabbitmq", "kube_control_plane"} <= fixtures
    assert fixtures == set(fixture_table()), "docs/testing.md's fixture table is not the plugin's"


@pytest.mark.parametrize("fixture", sorted(GIVES))
def test_every_attribute_the_table_names_exists(fixture: str) -> None:
    row = fixture_table()[fixture]
    named = set(re.findall(rf"`{fixture}\.(\w+)", row))
    assert named, f"the row of {fixture} names none of its attributes"
    cls = GIVES[fixture]
    fields = getattr(cls, "__dataclass_fields__", {})
    missing = [a for a in named if not hasattr(cls, a) and a not in fields]
    if cls in (NatsServerProcess, RabbitMQProcess, NatsCluster, KubeCluster):
        instance = cls.__new__(cls)  # attributes set in __init__: construct one for real
        if cls is RabbitMQProcess or cls is KubeCluster:
            instance.__init__(Path("/nonexistent"))  # type: ignore[misc]
        else:
            instance.__init__()  # type: ignore[misc]
        missing = [a for a in missing if not hasattr(instance, a)]
    assert not missing, f"docs/testing.md names {fixture}.{missing}, which does not exist"
