"""The chart rendered by the real helm: lint, wiring, and values it must refuse."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsqworker.settings import ENV_PREFIX, RESERVED_ENV_VARS, Settings, SettingsError
from nsqworker.supervisor import DRAIN_MARGIN

from .conftest import RELEASE

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nsqworker"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
CI_IDS = [p.stem for p in CI_VALUES]
SPARK_ENV = {
    "NSQWORKER_SPARK_RUNNER",
    "NSQWORKER_SPARK_NAMESPACE",
    "NSQWORKER_SPARK_IMAGE",
    "NSQWORKER_SPARK_SERVICE_ACCOUNT",
    "NSQWORKER_SPARK_TTL",
    "NSQWORKER_SPARK_APP_URIS",
}


def ci(name: str) -> Path:
    return CHART / "ci" / f"{name}-values.yaml"


def chart_values(*files: Path, **overrides: Any) -> dict[str, Any]:
    """The effective values: values.yaml, then ``files``, then ``overrides`` (shallow)."""
    import yaml

    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in files:
        _merge(values, yaml.safe_load(path.read_text()))
    _merge(values, overrides)
    return values


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def settings_env_names() -> set[str]:
    return {Settings.env_name(name) for name in Settings.model_fields}


def nsqworker_env_names(manifests: Any) -> set[str]:
    """Every NSQWORKER_* variable the pod gets (ConfigMap and container env)."""
    names = set(manifests.configmap_env())
    names |= {e["name"] for e in manifests.container().get("env", [])}
    return {n for n in names if n.startswith(ENV_PREFIX)}


# ---------------------------------------------------------------------------- lint


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["default", *CI_IDS])
def test_helm_lint_strict(helm: Any, values: Path | None) -> None:
    args = ["-f", str(values)] if values else []
    out = helm.run("lint", "--strict", str(CHART), *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_every_ci_values_file_is_tested() -> None:
    stems = {p.stem for p in CI_VALUES}
    assert {"keda-values", "hpa-values", "spark-rbac-values", "tls-secret-values"} <= stems


# ---------------------------------------------------------------------------- wiring


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["default", *CI_IDS])
def test_probes_point_at_the_health_port_and_paths(helm: Any, values: Path | None) -> None:
    manifests = helm.template(*([values] if values else []))
    effective = chart_values(*([values] if values else []))
    container = manifests.container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": effective["healthPort"]}
    assert manifests.configmap_env()["NSQWORKER_HEALTH_PORT"] == str(effective["healthPort"])
    # the paths nsqworker.health serves
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["startupProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    service = manifests.find("Service")
    assert service["spec"]["ports"][0]["targetPort"] == "health"
    assert (
        service["spec"]["selector"]
        == manifests.find("Deployment")["spec"]["selector"]["matchLabels"]
    )


def test_on_the_host_network_the_health_server_binds_the_nodes_address(helm: Any) -> None:
    assert not [e for e in helm.template().container()["env"] if e["name"].endswith("HEALTH_HOST")]
    env = helm.template(values={"hostNetwork": True}).container()["env"]
    bound = [e for e in env if e["name"] == "NSQWORKER_HEALTH_HOST"]
    assert bound == [
        {"name": "NSQWORKER_HEALTH_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]
    chosen = helm.template(values={"hostNetwork": True, "healthHost": "127.0.0.1"})
    assert not [e for e in chosen.container()["env"] if e["name"] == "NSQWORKER_HEALTH_HOST"]
    assert chosen.configmap_env()["NSQWORKER_HEALTH_HOST"] == "127.0.0.1"


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["default", *CI_IDS])
def test_grace_period_outlasts_the_drain(helm: Any, values: Path | None) -> None:
    manifests = helm.template(*([values] if values else []))
    drain = float(manifests.configmap_env()["NSQWORKER_DRAIN_TIMEOUT"])
    grace = manifests.pod_spec()["terminationGracePeriodSeconds"]
    # the supervisor kills workers DRAIN_MARGIN s after the drain timeout
    assert grace > drain + DRAIN_MARGIN
    if chart_values(*([values] if values else [])).get("terminationGracePeriodSeconds") is None:
        assert grace == math.ceil(drain) + 15


def test_grace_period_follows_a_fractional_drain(helm: Any) -> None:
    manifests = helm.template(values={"drainTimeout": 2.5})
    assert manifests.configmap_env()["NSQWORKER_DRAIN_TIMEOUT"] == "2.5"
    assert manifests.pod_spec()["terminationGracePeriodSeconds"] == 18


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["default", *CI_IDS])
def test_env_names_are_settings(helm: Any, values: Path | None) -> None:
    manifests = helm.template(*([values] if values else []))
    names = nsqworker_env_names(manifests)
    unknown = names - settings_env_names() - RESERVED_ENV_VARS
    assert not unknown, f"the chart sets variables Settings does not know: {sorted(unknown)}"


def test_spark_env_names_are_settings(helm: Any) -> None:
    manifests = helm.template(ci("spark-rbac"))
    assert nsqworker_env_names(manifests) >= SPARK_ENV
    assert settings_env_names() >= SPARK_ENV


@pytest.mark.parametrize(
    "values",
    [None, ci("keda"), ci("hpa"), ci("spark-rbac")],
    ids=["default", "keda-values", "hpa-values", "spark-rbac-values"],
)
def test_settings_accept_the_rendered_environment(
    helm: Any, values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names and values: Settings.load() takes the ConfigMap as it stands."""
    manifests = helm.template(*([values] if values else []))
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    for key, value in manifests.configmap_env().items():
        monkeypatch.setenv(key, value)
    try:
        settings = Settings.load()
    except SettingsError as exc:
        pytest.fail(f"Settings refuses the chart's environment:\n{exc}")
    effective = chart_values(*([values] if values else []))
    assert settings.workers == effective["workers"]
    assert settings.drain_timeout == effective["drainTimeout"]
    for name, value in effective["settings"].items():
        assert getattr(settings, name) == value


def test_settings_keys_become_env(helm: Any) -> None:
    env = helm.template(ci("hpa")).configmap_env()
    assert env["NSQWORKER_MAX_IN_FLIGHT"] == "1000000"  # no 1e+06 from Helm's floats
    assert env["NSQWORKER_RETRY_DELAY"] == "2.5"
    assert env["NSQWORKER_TRACING_ENVELOPE"] == "true"
    assert env["NSQWORKER_NSQD_TCP_ADDRESSES"] == "nsqd-0.nsqd.nsq:4150,nsqd-1.nsqd.nsq:4150"
    assert "NSQWORKER_LOOKUPD_HTTP_ADDRESSES" not in env
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.01"


def test_the_settings_schema_lists_every_setting_without_a_dedicated_value() -> None:
    """values.schema.json's settings are Settings' fields (scripts/helm-values-doc)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "helm-values-doc"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["default", *CI_IDS])
def test_security_context(helm: Any, values: Path | None, dockerfile: Any) -> None:
    manifests = helm.template(*([values] if values else []))
    pod = manifests.pod_spec()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the image's numeric USER, so runAsNonRoot can be verified without reading /etc/passwd
    (user,) = dockerfile.all(dockerfile.runtime, "USER")
    assert pod["securityContext"]["runAsUser"] == int(user.split(":")[0])
    container = manifests.container()
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["tmp"] == "/tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    assert "resources" in container and container["resources"]["limits"]["memory"]


def test_defaults_have_a_pdb_and_no_autoscaler(helm: Any) -> None:
    manifests = helm.template()
    assert manifests.find("Deployment")["spec"]["replicas"] == 1
    assert manifests.find("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert not manifests.kinds() & {"HorizontalPodAutoscaler", "ScaledObject", "Role"}
    assert manifests.pod_spec()["automountServiceAccountToken"] is False


def test_keda_scaled_object(helm: Any) -> None:
    manifests = helm.template(ci("keda"))
    deployment = manifests.find("Deployment")
    assert "replicas" not in deployment["spec"]  # KEDA owns the count
    assert "HorizontalPodAutoscaler" not in manifests.kinds()
    scaled = manifests.find("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (
        1,
        20,
        15,
    )
    lookupd = "nsqlookupd-0.nsqlookupd.nsq:4161,nsqlookupd-1.nsqlookupd.nsq:4161"
    assert spec["triggers"] == [
        {
            "type": "nsq",
            "name": "clicks-archive",
            "metadata": {
                "nsqLookupdHTTPAddresses": lookupd,  # host:port, no scheme, as KEDA wants
                "topic": "clicks",
                "channel": "archive",
                "depthThreshold": "50",
                "activationDepthThreshold": "0",
                "useHttps": "false",
                "unsafeSsl": "false",
            },
        },
        {
            "type": "nsq",
            "name": "reports-spark",
            "metadata": {
                "nsqLookupdHTTPAddresses": lookupd,
                "topic": "reports",
                "channel": "spark",
                "depthThreshold": "2",
                "activationDepthThreshold": "0",
                "useHttps": "false",
                "unsafeSsl": "false",
            },
        },
    ]
    # the workers read the same lookupd addresses, scheme and all
    env = manifests.configmap_env()
    assert env["NSQWORKER_LOOKUPD_HTTP_ADDRESSES"] == (
        "http://nsqlookupd-0.nsqlookupd.nsq:4161,nsqlookupd-1.nsqlookupd.nsq:4161"
    )


def test_keda_min_replica_count_defaults_to_one(helm: Any) -> None:
    values = {"keda": {"enabled": True, "channels": [{"topic": "t", "channel": "c"}]}}
    scaled = helm.template(values=values).find("ScaledObject")
    assert scaled["spec"]["minReplicaCount"] == 1


def test_keda_https_lookupd(helm: Any) -> None:
    values = {
        "nsq": {"lookupdHttpAddresses": ["https://lookupd.nsq:4161/"]},
        "keda": {"enabled": True, "unsafeSsl": True, "channels": [{"topic": "t", "channel": "c"}]},
    }
    (trigger,) = helm.template(values=values).find("ScaledObject")["spec"]["triggers"]
    assert trigger["metadata"]["nsqLookupdHTTPAddresses"] == "lookupd.nsq:4161"
    assert trigger["metadata"]["useHttps"] == "true"
    assert trigger["metadata"]["unsafeSsl"] == "true"


def test_service_monitor_scrapes_the_health_port(helm: Any) -> None:
    manifests = helm.template(ci("keda"))
    monitor = manifests.find("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "health", "path": "/metrics", "interval": "15s"}
    ]
    service = manifests.find("Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["health"]
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_network_policy_admits_only_the_listed_peers_to_the_health_port(helm: Any) -> None:
    manifests = helm.template(ci("networkpolicy"))
    policy = manifests.find("NetworkPolicy")
    selector = manifests.find("Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "health", "protocol": "TCP"}]
    assert "health" in {p["name"] for p in manifests.container()["ports"]}
    listed = chart_values(ci("networkpolicy"))["networkPolicy"]["health"]["from"]
    assert rule["from"] == listed and len(listed) == 2


def test_network_policy_is_off_by_default_and_lets_no_one_in_when_it_lists_no_one(
    helm: Any,
) -> None:
    assert "NetworkPolicy" not in helm.template().kinds()
    policy = helm.template(values={"networkPolicy": {"enabled": True}}).find("NetworkPolicy")
    assert policy["spec"]["ingress"] == []  # only the node (the kubelet's probes)


def test_hpa(helm: Any) -> None:
    manifests = helm.template(ci("hpa"))
    assert "replicas" not in manifests.find("Deployment")["spec"]
    hpa = manifests.find("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == manifests.find("Deployment")["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    assert manifests.pod_spec()["terminationGracePeriodSeconds"] == 150
    assert manifests.configmap_env()["NSQWORKER_WORKERS"] == "4"
    assert manifests.container()["args"] == ["run", "myservice.tasks:registry"]


def test_spark_rbac(helm: Any) -> None:
    manifests = helm.template(ci("spark-rbac"), namespace="reports")
    role = manifests.find("Role")
    assert role["metadata"]["namespace"] == "spark-jobs"
    assert role["rules"] == [
        {
            "apiGroups": ["sparkoperator.k8s.io"],
            "resources": ["sparkapplications"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        }
    ]
    binding = manifests.find("RoleBinding")
    assert binding["metadata"]["namespace"] == "spark-jobs"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = manifests.pod_spec()["serviceAccountName"]
    assert manifests.find("ServiceAccount")["metadata"]["name"] == account
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "reports"}
    ]
    assert manifests.pod_spec()["automountServiceAccountToken"] is True  # the runner's client
    env = manifests.configmap_env()
    assert {k: v for k, v in env.items() if k.startswith("NSQWORKER_SPARK_")} == {
        "NSQWORKER_SPARK_RUNNER": "kubernetes",
        "NSQWORKER_SPARK_NAMESPACE": "spark-jobs",
        "NSQWORKER_SPARK_IMAGE": "registry.example.com/reports-spark:2.0.0",
        "NSQWORKER_SPARK_SERVICE_ACCOUNT": "spark-driver",
        "NSQWORKER_SPARK_TTL": "7200",
        "NSQWORKER_SPARK_APP_URIS": '["local://*"]',
    }


def test_spark_namespace_defaults_to_the_release_namespace(helm: Any) -> None:
    values = {"spark": {"kubernetes": {"enabled": True, "image": "spark:3.5"}}}
    manifests = helm.template(values=values, namespace="jobs")
    assert manifests.find("Role")["metadata"]["namespace"] == "jobs"
    assert manifests.configmap_env()["NSQWORKER_SPARK_NAMESPACE"] == "jobs"


def test_tls_and_auth_from_existing_secrets(helm: Any) -> None:
    manifests = helm.template(ci("tls-secret"))
    pod = manifests.pod_spec()
    container = manifests.container()
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "nsq-client-tls"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": "/etc/nsqworker/tls", "readOnly": True}
    env = manifests.configmap_env()
    assert env["NSQWORKER_TLS_V1"] == "true"
    assert env["NSQWORKER_TLS_VERIFY"] == "true"
    assert env["NSQWORKER_TLS_CA_FILE"] == "/etc/nsqworker/tls/ca.crt"
    assert env["NSQWORKER_TLS_CERT_FILE"] == "/etc/nsqworker/tls/tls.crt"
    assert env["NSQWORKER_TLS_KEY_FILE"] == "/etc/nsqworker/tls/tls.key"
    assert env["NSQWORKER_TLS_SERVER_NAME"] == "nsqd.nsq.svc"
    secret_env = {e["name"]: e for e in container["env"]}
    assert secret_env["NSQWORKER_AUTH_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "nsq-auth", "key": "secret"}
    }
    assert "NSQWORKER_AUTH_SECRET" not in env  # never in the ConfigMap
    assert secret_env["MYSERVICE_MODE"] == {"name": "MYSERVICE_MODE", "value": "strict"}


def test_otlp_headers_come_from_a_secret(helm: Any) -> None:
    manifests = helm.template(values={"otel": {"headersSecret": "otlp", "headersKey": "h"}})
    env = {e["name"]: e for e in manifests.container()["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"] == {
        "secretKeyRef": {"name": "otlp", "key": "h"}
    }
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in manifests.configmap_env()


def test_config_change_rolls_the_pods(helm: Any) -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        deployment = helm.template(values=values).find("Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum(None) == checksum(None)
    assert checksum({"settings": {"max_in_flight": 7}}) != checksum(None)


def test_tasks_become_args_and_the_image_cmd_runs_without(helm: Any) -> None:
    assert "args" not in helm.template().container()
    container = helm.template(
        values={"tasks": "svc.tasks", "extraArgs": ["--hung-timeout", "90"]}
    ).container()
    assert container["args"] == ["run", "svc.tasks", "--hung-timeout", "90"]
    assert "command" not in container  # the image's ENTRYPOINT runs (test_dockerfile)


def test_helm_test_hook_checks_readyz(helm: Any) -> None:
    manifests = helm.template(values={"healthPort": 9100})
    pod = manifests.find("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    service = manifests.find("Service")["metadata"]["name"]
    assert f"http://{service}:9100/readyz" in script
    assert pod["spec"]["containers"][0]["image"] == manifests.container()["image"]


# ---------------------------------------------------------------------------- refused


BAD_VALUES = [
    pytest.param(
        {"drainTimeout": -1}, "at '/drainTimeout': minimum: got -1, want 0", id="negative-drain"
    ),
    pytest.param(
        {"replicaCount": 1.5},
        "at '/replicaCount': got number, want integer",
        id="fractional-replicas",
    ),
    pytest.param(
        {"replicaCount": "2"}, "at '/replicaCount': got string, want integer", id="string-replicas"
    ),
    pytest.param(
        {"imagee": {"repository": "x"}}, "additional properties 'imagee' not allowed", id="typo-top"
    ),
    pytest.param(
        {"image": {"tga": "1.0"}},
        "at '/image': additional properties 'tga' not allowed",
        id="typo-nested",
    ),
    pytest.param(
        {"settings": {"max_in_flite": 10}},
        "at '/settings': additional properties 'max_in_flite' not allowed",
        id="typo-setting",
    ),
    pytest.param(
        {"settings": {"msg_timeout": 1000}},
        "at '/settings/msg_timeout': maximum",
        id="setting-bound",
    ),
    pytest.param(
        {"settings": {"compression": "zstd"}}, "at '/settings/compression'", id="setting-enum"
    ),
    pytest.param(
        {"settings": {"drain_timeout": 5}},
        "additional properties 'drain_timeout'",
        id="dedicated-setting",
    ),
    pytest.param(
        {"healthPort": 0}, "at '/healthPort': minimum: got 0, want 1", id="health-port-off"
    ),
    pytest.param(
        {"networkPolicy": {"health": {"from": [{"podSelectr": {}}]}}},
        "additional properties 'podSelectr' not allowed",
        id="network-policy-peer",
    ),
    pytest.param({"logLevel": "verbose"}, "at '/logLevel'", id="log-level"),
    pytest.param(
        {"keda": {"channels": [{"topic": "t"}]}}, "missing property 'channel'", id="keda-channel"
    ),
    pytest.param(
        {"otel": {"env": {"JAEGER_HOST": "x"}}},
        "'JAEGER_HOST' does not match pattern '^OTEL_[A-Z0-9_]+$'",
        id="otel-env-name",
    ),
    pytest.param(
        {"drainTimeout": 60, "terminationGracePeriodSeconds": 65},
        "terminationGracePeriodSeconds (65) must be more than drainTimeout + 5 (65)",
        id="grace-shorter-than-drain",
    ),
    pytest.param(
        {"keda": {"enabled": True}},
        "keda.enabled needs keda.channels: one {topic, channel} per task",
        id="keda-without-channels",
    ),
    pytest.param(
        {
            "keda": {"enabled": True, "channels": [{"topic": "t", "channel": "c"}]},
            "autoscaling": {"enabled": True},
        },
        "keda.enabled and autoscaling.enabled are exclusive",
        id="keda-and-hpa",
    ),
    pytest.param(
        {
            "nsq": {"lookupdHttpAddresses": [], "nsqdTcpAddresses": ["nsqd:4150"]},
            "keda": {"enabled": True, "channels": [{"topic": "t", "channel": "c"}]},
        },
        "keda.enabled needs nsq.lookupdHttpAddresses",
        id="keda-without-lookupd",
    ),
    pytest.param(
        {
            "keda": {
                "enabled": True,
                "minReplicaCount": 5,
                "maxReplicaCount": 2,
                "channels": [{"topic": "t", "channel": "c"}],
            }
        },
        "keda.minReplicaCount (5) is more than keda.maxReplicaCount (2)",
        id="keda-min-over-max",
    ),
    pytest.param(
        {"nsq": {"lookupdHttpAddresses": []}},
        "set nsq.lookupdHttpAddresses or nsq.nsqdTcpAddresses",
        id="no-nsq",
    ),
    pytest.param(
        {"tls": {"enabled": True}}, "tls.enabled needs tls.existingSecret", id="tls-without-secret"
    ),
    pytest.param(
        {"tls": {"enabled": True, "existingSecret": "s", "certKey": "tls.crt"}},
        "tls.certKey and tls.keyKey go together",
        id="tls-cert-without-key",
    ),
    pytest.param(
        {"otel": {"env": {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc"}}},
        "otel.env.OTEL_EXPORTER_OTLP_HEADERS would put the collector's API keys in a ConfigMap",
        id="otel-headers-in-configmap",
    ),
    pytest.param(
        {"spark": {"kubernetes": {"enabled": True}}},
        "spark.kubernetes.enabled needs spark.kubernetes.image",
        id="spark-without-image",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_bad_values_are_refused(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(AssertionError) as refused:  # Helm.run raises HelmError
        helm.template(values=values)
    assert message in str(refused.value)


def test_the_native_spark_runner_gets_pods_rbac_and_its_templates(helm: Any) -> None:
    spark = {"enabled": True, "image": "spark:1", "runner": "native"}
    spark["driverTemplate"] = {"spec": {"hostNetwork": True}}
    manifests = helm.template(values={"spark": {"kubernetes": spark}})
    env = manifests.configmap_env()
    assert env["NSQWORKER_SPARK_RUNNER"] == "kubernetes-native"
    assert env["NSQWORKER_SPARK_DRIVER_TEMPLATE"] == "/etc/nsqworker/spark/driver.yaml"
    assert "NSQWORKER_SPARK_EXECUTOR_TEMPLATE" not in env
    rules = manifests.find("Role", name=f"{RELEASE}-nsqworker-spark")["rules"]
    assert {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]} in rules
    assert not [r for r in rules if "sparkoperator.k8s.io" in r["apiGroups"]]
    configmap = manifests.find("ConfigMap", name=f"{RELEASE}-nsqworker-spark-templates")
    assert "hostNetwork: true" in configmap["data"]["driver.yaml"]
    mount = {"name": "spark-templates", "mountPath": "/etc/nsqworker/spark", "readOnly": True}
    assert mount in manifests.container()["volumeMounts"]
    # the default stays the SparkApplication runner, with no templates mounted
    default = helm.template(values={"spark": {"kubernetes": {"enabled": True, "image": "i"}}})
    assert default.configmap_env()["NSQWORKER_SPARK_RUNNER"] == "kubernetes"
    assert "spark-templates" not in str(default.container()["volumeMounts"])
