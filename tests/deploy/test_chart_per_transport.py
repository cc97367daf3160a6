"""What the chart says on each transport: its validation messages, the ScaledObject's
comments, and NOTES.txt's `kubectl create secret` lines (issue 39).

NOTES.txt is rendered by ``helm template`` through a copy of the chart with one more
template that renders the notes with ``tpl`` (``helm install --dry-run`` wants a cluster).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, Helm, HelmError

NATS = {"transport": "nats", "nats": {"servers": ["nats://nats:4222"]}}
STREAMS = {"transport": "rabbitmq-stream", "rabbitmqStream": {"existingSecret": "orders-rmq"}}
ONE_CHANNEL = [{"topic": "orders", "channel": "billing"}]


def notes(helm: Helm, values: dict[str, Any], tmp_path: Path) -> str:
    """NOTES.txt as ``helm install`` would print it for ``values``."""
    chart = tmp_path / "chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.tpl")
        probe = 'notes: {{ tpl (.Files.Get "notes.tpl") . | toJson }}\n'
        (chart / "templates" / "notes-probe.yaml").write_text(probe)
    out = helm.run(
        "template", "orders", str(chart), "-s", "templates/notes-probe.yaml",
        *helm.value_args([], values),
    )  # fmt: skip
    return str(yaml.safe_load(out)["notes"])


def test_keda_on_rabbitmq_stream_is_refused_at_once_with_the_hpa_named(helm: Helm) -> None:
    """Before: with no keda.channels the chart first asked for them, then refused KEDA."""
    with pytest.raises(HelmError) as refused:
        helm.template(values={**STREAMS, "keda": {"enabled": True}})
    message = refused.value.stderr
    assert "keda.enabled is not for transport rabbitmq-stream" in message
    assert "keda.channels" not in message
    assert "autoscaling.enabled=true" in message and "HorizontalPodAutoscaler" in message
    with pytest.raises(HelmError) as both:  # and before the KEDA/HPA exclusion
        helm.template(
            values={**STREAMS, "keda": {"enabled": True}, "autoscaling": {"enabled": True}}
        )
    assert "keda.enabled is not for transport rabbitmq-stream" in both.value.stderr


def test_the_nats_scaled_object_speaks_of_the_nats_trigger(helm: Helm) -> None:
    values = {
        **NATS,
        "nats": {**NATS["nats"], "monitoringEndpoint": "nats:8222"},
        "keda": {"enabled": True, "channels": ONE_CHANNEL},
    }
    out = helm.run(
        "template", "orders", str(CHART), "-s", "templates/scaledobject.yaml",
        *helm.value_args([], values),
    )  # fmt: skip
    assert "nsq trigger" not in out
    assert "counts the\n  # consumer's pending + ack-pending messages" in out
    nsq = helm.run(
        "template", "orders", str(CHART), "-s", "templates/scaledobject.yaml",
        *helm.value_args([], {"keda": {"enabled": True, "channels": ONE_CHANNEL}}),
    )  # fmt: skip
    assert "the nsq trigger sees channel depth only" in nsq


def test_notes_give_the_kubectl_line_for_the_rabbitmq_uri(helm: Helm, tmp_path: Path) -> None:
    text = notes(helm, STREAMS, tmp_path)
    assert "kubectl -n default create secret generic orders-rmq \\" in text
    assert "--from-literal=uri='rabbitmq-stream://USER:PASSWORD@HOST:5552/VHOST'" in text


def test_notes_give_the_kubectl_line_for_nats_credentials(helm: Helm, tmp_path: Path) -> None:
    none = notes(helm, NATS, tmp_path)
    assert "kubectl -n default create secret generic orders-nsqworker-nats" in none
    assert "nats.auth.existingSecret=orders-nsqworker-nats" in none
    given = {**NATS, "nats": {**NATS["nats"], "auth": {
        "existingSecret": "nats-app", "userKey": "user", "passwordKey": "password"}}}  # fmt: skip
    text = notes(helm, given, tmp_path)
    line = "kubectl -n default create secret generic nats-app --from-literal=user=USER"
    assert f"{line} --from-literal=password=PASSWORD" in text


def test_notes_give_the_kubectl_line_for_the_nsqd_auth_secret(helm: Helm, tmp_path: Path) -> None:
    text = notes(helm, {"auth": {"existingSecret": "nsq-auth"}}, tmp_path)
    assert "create secret generic nsq-auth --from-literal=auth-secret=SECRET" in text
    assert "create secret" not in notes(helm, {}, tmp_path)  # nothing to create


def test_kubernetes_md_gives_a_kubectl_line_for_each_broker() -> None:
    page = (CHART.parents[2] / "docs" / "kubernetes.md").read_text()
    assert "kubectl create secret generic nsq-auth --from-literal=auth-secret=" in page
    assert "kubectl create secret generic myservice-nats --from-literal=user=" in page
    assert "kubectl create secret generic myservice-rabbitmq \\" in page
