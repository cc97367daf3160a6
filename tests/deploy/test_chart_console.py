"""The chart's ``console.enabled``: the console's Deployment, Service and RBAC, rendered
by the real helm."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import CHART, RELEASE, HelmError

CONSOLE = {"console": {"enabled": True, "tokenSecret": "console-token", "pollInterval": 1}}
NAME = f"{RELEASE}-nsqworker-console"


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_no_console_by_default(helm: Any) -> None:
    manifests = helm.template()
    assert not any("console" in d["metadata"]["name"] for d in manifests)


def test_lint_with_the_console(helm: Any) -> None:
    helm.run("lint", "--strict", str(CHART), "-f", str(helm.values_file(CONSOLE)))


def test_the_console_finds_only_the_worker_pods(helm: Any) -> None:
    manifests = helm.template(values=CONSOLE, namespace="orders")
    workers = manifests.find("Deployment", RELEASE + "-nsqworker")
    console = manifests.find("Deployment", NAME)
    pod_labels = console["spec"]["template"]["metadata"]["labels"]
    worker_labels = workers["spec"]["template"]["metadata"]["labels"]
    # the workers' Deployment, Service and PDB never select the console's pod
    assert not matches(workers["spec"]["selector"]["matchLabels"], pod_labels)
    assert not matches(
        manifests.find("Service", RELEASE + "-nsqworker")["spec"]["selector"], pod_labels
    )
    assert not matches(
        manifests.find("PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels
    )
    assert matches(console["spec"]["selector"]["matchLabels"], pod_labels)
    assert matches(manifests.find("Service", NAME)["spec"]["selector"], pod_labels)
    # its selector picks the worker pods
    (container,) = console["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:5] == ["console", "--host", "0.0.0.0", "--port", "8081"]
    selector = dict(p.split("=") for p in args[args.index("--kubernetes-selector") + 1].split(","))
    assert matches(selector, worker_labels) and not matches(selector, pod_labels)
    env = env_of(container)
    assert env["NSQWORKER_CONSOLE_TOKEN"] == {
        "secretKeyRef": {"name": "console-token", "key": "token"}
    }
    assert env["NSQWORKER_CONSOLE_KUBERNETES_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert env["NSQWORKER_CONSOLE_WORKER_PORT"] == "8080"
    assert env["NSQWORKER_CONSOLE_POLL_INTERVAL"] == "1"
    assert container["envFrom"] == [{"configMapRef": {"name": RELEASE + "-nsqworker"}}]
    assert container["ports"] == [{"name": "http", "containerPort": 8081, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert console["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_console_may_only_list_pods(helm: Any) -> None:
    manifests = helm.template(values=CONSOLE, namespace="orders")
    role = manifests.find("Role", NAME)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert "ClusterRole" not in manifests.kinds()
    binding = manifests.find("RoleBinding", NAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": NAME,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "orders"}]
    pod = manifests.find("Deployment", NAME)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME and pod["automountServiceAccountToken"] is True
    assert manifests.find("ServiceAccount", NAME)["automountServiceAccountToken"] is True
    # the workers' own pods still mount no token
    workers = manifests.find("Deployment", RELEASE + "-nsqworker")["spec"]["template"]["spec"]
    assert workers["automountServiceAccountToken"] is False
    assert manifests.find("Service", NAME)["spec"]["type"] == "ClusterIP"


def test_without_a_token_secret_the_console_is_read_only(helm: Any) -> None:
    manifests = helm.template(values={"console": {"enabled": True}})
    (container,) = manifests.find("Deployment", NAME)["spec"]["template"]["spec"]["containers"]
    assert "NSQWORKER_CONSOLE_TOKEN" not in env_of(container)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"console": {"enabled": True, "port": 0}}, "port"),
        ({"console": {"enabled": True, "pollInterval": 0}}, "pollInterval"),
        ({"console": {"enabled": True, "token": "in-values"}}, "token"),
        ({"console": {"enabled": "yes"}}, "enabled"),
    ],
)
def test_bad_console_values_are_refused(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        helm.template(values=values)


def test_the_console_installs_into_a_real_api_server(kube: Any, kube_helm: Any) -> None:
    from .test_chart_install import assert_contains, read_back

    namespace = "console-install"
    kube.create_namespace(namespace)
    values = kube_helm.values_file({**CONSOLE, "tasks": "myservice.tasks"})
    kube_helm.run("install", RELEASE, str(CHART), "-n", namespace, "-f", str(values))
    try:
        rendered = kube_helm.template(values=CONSOLE, namespace=namespace)
        for obj in rendered:
            if obj["metadata"]["name"] == NAME:  # stored as rendered: nothing pruned
                assert_contains(read_back(kube, obj, namespace), obj, f"{obj['kind']}/{NAME}")
        kinds = {o["kind"] for o in rendered if o["metadata"]["name"] == NAME}
        assert kinds == {"ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"}
    finally:
        kube_helm.run("uninstall", RELEASE, "-n", namespace)


def test_a_network_policy_lets_the_console_in(helm: Any) -> None:
    values = {**CONSOLE, "networkPolicy": {"enabled": True}}
    manifests = helm.template(values=values)
    policy = manifests.find("NetworkPolicy", RELEASE + "-nsqworker")
    pod_labels = manifests.find("Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "health", "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert matches(peer["podSelector"]["matchLabels"], pod_labels)
    alone = helm.template(values={"networkPolicy": {"enabled": True}})
    assert alone.find("NetworkPolicy")["spec"]["ingress"] == []  # without the console: nobody
