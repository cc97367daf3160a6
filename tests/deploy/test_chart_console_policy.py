"""The console's own NetworkPolicy (``networkPolicy.console.from``) and its session
values (``console.sessionTtl``, ``console.forwardedAllowIps``), rendered by the real helm
and stored by a real kube-apiserver."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import CHART, RELEASE, HelmError

NAME = f"{RELEASE}-nsqworker-console"
INGRESS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ingress-nginx"}},
    },
    {"ipBlock": {"cidr": "10.20.0.0/16"}},
]
VALUES = {
    "console": {"enabled": True, "tokenSecret": "console-token"},
    "networkPolicy": {"enabled": True, "console": {"from": INGRESS}},
}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_console_pod_admits_only_networkpolicy_console_from(helm: Any) -> None:
    manifests = helm.template(values=VALUES)
    policy = manifests.find("NetworkPolicy", NAME)
    console = manifests.find("Deployment", NAME)["spec"]["template"]
    workers = manifests.find("Deployment", RELEASE + "-nsqworker")["spec"]["template"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert matches(selector, console["metadata"]["labels"])
    assert not matches(selector, workers["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (container,) = console["spec"]["containers"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {"name": "http", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert rule["from"] == INGRESS
    # the workers' policy still admits the console to their health port, and only that
    (worker_rule,) = manifests.find("NetworkPolicy", RELEASE + "-nsqworker")["spec"]["ingress"]
    assert worker_rule["ports"] == [{"port": "health", "protocol": "TCP"}]
    assert matches(
        worker_rule["from"][0]["podSelector"]["matchLabels"], console["metadata"]["labels"]
    )


def test_an_empty_console_from_lets_no_one_in(helm: Any) -> None:
    manifests = helm.template(values={**VALUES, "networkPolicy": {"enabled": True}})
    assert manifests.find("NetworkPolicy", NAME)["spec"]["ingress"] == []
    without_console = helm.template(
        values={"networkPolicy": {"enabled": True, "console": {"from": INGRESS}}}
    )
    assert [p["metadata"]["name"] for p in without_console if p["kind"] == "NetworkPolicy"] == [
        RELEASE + "-nsqworker"
    ]
    no_policy = helm.template(values={"console": {"enabled": True}})
    assert "NetworkPolicy" not in no_policy.kinds()


def test_the_session_values_reach_the_console(helm: Any) -> None:
    values = {
        "console": {
            "enabled": True,
            "sessionTtl": 3600,
            "forwardedAllowIps": ["10.0.0.0/8", "192.168.1.7"],
        }
    }
    (container,) = helm.template(values=values).find("Deployment", NAME)["spec"]["template"][
        "spec"
    ]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NSQWORKER_CONSOLE_SESSION_TTL"] == "3600"
    assert env["NSQWORKER_CONSOLE_FORWARDED_ALLOW_IPS"] == "10.0.0.0/8,192.168.1.7"
    (default,) = helm.template(values={"console": {"enabled": True}}).find("Deployment", NAME)[
        "spec"
    ]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in default["env"]}
    assert env["NSQWORKER_CONSOLE_SESSION_TTL"] == "43200"
    assert "NSQWORKER_CONSOLE_FORWARDED_ALLOW_IPS" not in env


BAD = [
    ({"networkPolicy": {"console": {"from": [{"podSelectr": {}}]}}}, "podSelectr"),
    ({"networkPolicy": {"console": {"from": "everyone"}}}, "console.from"),
    ({"networkPolicy": {"console": {"to": []}}}, "'to' not allowed"),
    ({"console": {"sessionTtl": 0}}, "sessionTtl"),
    ({"console": {"forwardedAllowIps": "10.0.0.0/8"}}, "forwardedAllowIps"),
]


def test_the_schema_takes_the_console_policy_and_session_values_and_checks_them(
    helm: Any,
) -> None:
    good = {
        **VALUES,
        "console": {**VALUES["console"], "sessionTtl": 60, "forwardedAllowIps": ["*"]},
    }
    helm.template(values=good)  # accepted as documented
    for values, message in BAD:
        with pytest.raises(HelmError, match=message):
            helm.template(values=values)


def test_lint_with_the_console_policy(helm: Any) -> None:
    helm.run("lint", "--strict", str(CHART), "-f", str(helm.values_file(VALUES)))


def test_the_console_policy_installs_into_a_real_api_server(kube: Any, kube_helm: Any) -> None:
    from .test_chart_install import assert_contains, read_back

    namespace = "console-policy"
    kube.create_namespace(namespace)
    values = {**VALUES, "tasks": "myservice.tasks"}
    kube_helm.run(
        "install", RELEASE, str(CHART), "-n", namespace, "-f", str(kube_helm.values_file(values))
    )
    try:
        rendered = kube_helm.template(values=values, namespace=namespace)
        policies = [o for o in rendered if o["kind"] == "NetworkPolicy"]
        assert {p["metadata"]["name"] for p in policies} == {NAME, RELEASE + "-nsqworker"}
        for policy in policies:  # stored as rendered: nothing pruned
            assert_contains(read_back(kube, policy, namespace), policy, policy["metadata"]["name"])
    finally:
        kube_helm.run("uninstall", RELEASE, "-n", namespace)
