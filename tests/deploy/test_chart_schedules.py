"""The chart's schedules value: the Lease RBAC, the token mount and the leader env."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nsqworker.settings import Settings

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nsqworker"
SCHEDULES = CHART / "ci" / "schedules-values.yaml"


def lease_rules(name: str) -> list[dict[str, Any]]:
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [name],
            "verbs": ["get", "update"],
        },
    ]


def test_schedules_get_a_lease_role_in_the_release_namespace(helm: Any) -> None:
    manifests = helm.template(SCHEDULES, namespace="reports")
    role = manifests.find("Role")
    assert role["metadata"]["namespace"] == "reports"
    name = manifests.configmap_env()["NSQWORKER_SCHEDULE_LEASE_NAME"]
    assert role["rules"] == lease_rules(name)
    binding = manifests.find("RoleBinding")
    assert binding["metadata"]["namespace"] == "reports"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"],
    }  # fmt: skip
    account = manifests.pod_spec()["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "reports"}
    ]
    assert manifests.pod_spec()["automountServiceAccountToken"] is True  # the elector's client
    assert manifests.find("ServiceAccount")["automountServiceAccountToken"] is True


def test_the_lease_name_defaults_to_the_release_and_stays_across_upgrades(helm: Any) -> None:
    env = helm.template(SCHEDULES, namespace="reports").configmap_env()
    assert env["NSQWORKER_SCHEDULE_LEADER"] == "kubernetes"
    assert env["NSQWORKER_SCHEDULE_LEASE_NAME"].endswith("-schedules")
    named = helm.template(SCHEDULES, values={"schedules": {"leaseName": "reports-beat"}})
    assert named.configmap_env()["NSQWORKER_SCHEDULE_LEASE_NAME"] == "reports-beat"
    assert named.find("Role")["rules"] == lease_rules("reports-beat")
    settings = Settings(
        schedule_leader=env["NSQWORKER_SCHEDULE_LEADER"],
        schedule_lease_name=env["NSQWORKER_SCHEDULE_LEASE_NAME"],
    )
    assert settings.schedule_leader == "kubernetes"


def test_without_schedules_there_is_no_lease_rbac_or_token(helm: Any) -> None:
    manifests = helm.template()
    assert "Role" not in manifests.kinds()
    assert manifests.pod_spec()["automountServiceAccountToken"] is False
    assert not {k for k in manifests.configmap_env() if k.startswith("NSQWORKER_SCHEDULE")}


@pytest.mark.parametrize("name", ["Bad_Name", "-x", "x" * 254])
def test_a_bad_lease_name_is_refused_at_install(helm: Any, name: str) -> None:
    with pytest.raises(Exception, match="leaseName"):
        helm.template(values={"schedules": {"enabled": True, "leaseName": name}})
