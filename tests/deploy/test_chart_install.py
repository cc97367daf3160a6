"""The chart against a real kube-apiserver, and its pod spec run for real without a kubelet.

The session's control plane (etcd + kube-apiserver, ``kube_control_plane``) runs no
controllers: Deployments get no ReplicaSets or pods, ScaledObjects no KEDA. What is
tested is what the API server does (schemas, defaults, CRD pruning, storage) and,
separately, that the pod spec it returns runs: its command, args, environment and probe
ports, started here as a local process against a local nsqd.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from nsqworker.testing import NsqdProcess, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nsqworker"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
APP_DIR = Path(__file__).resolve().parent / "app"  # the image's /app: the task module
VENV = ROOT / ".venv"  # the image's /opt/nsqworker: the entrypoint
RELEASE = "orders"
FULLNAME = f"{RELEASE}-nsqworker"


def client_module() -> Any:
    from kubernetes import client

    return client


def read_back(kube: Any, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The stored object of the same kind and name, as a plain dict (camelCase)."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(kube.api_client())
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    ns = obj["metadata"].get("namespace", namespace) if resource.namespaced else None
    stored: dict[str, Any] = dyn.get(resource, name=obj["metadata"]["name"], namespace=ns).to_dict()
    return stored


def assert_contains(stored: Any, rendered: Any, where: str = "") -> None:
    """Every field of ``rendered`` is in ``stored`` with the same value (the API server
    adds defaults; a field it pruned or changed is a difference)."""
    if isinstance(rendered, dict):
        assert isinstance(stored, dict), f"{where}: {stored!r} is not a mapping"
        for key, value in rendered.items():
            assert key in stored, f"{where}.{key} was not stored (pruned by the schema?)"
            assert_contains(stored[key], value, f"{where}.{key}")
    elif isinstance(rendered, list):
        assert isinstance(stored, list) and len(stored) == len(rendered), f"{where}: {stored!r}"
        for i, (s, r) in enumerate(zip(stored, rendered, strict=True)):
            assert_contains(s, r, f"{where}[{i}]")
    else:
        assert stored == rendered, f"{where}: stored {stored!r}, rendered {rendered!r}"


def gone(read: Any, *args: Any) -> bool:
    client = client_module()
    try:
        read(*args)
    except client.ApiException as exc:
        return bool(exc.status == 404)
    return False


# ---------------------------------------------------------------------------- lifecycle


def test_install_upgrade_uninstall(kube: Any, kube_helm: Any) -> None:
    client = client_module()
    api = kube.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    ns = "lifecycle"
    kube.create_namespace(ns)
    image = {"repository": "registry.example.com/myservice", "tag": "1.0"}
    first = kube_helm.values_file({"tasks": "myservice.tasks", "image": image})
    notes = kube_helm.run("install", RELEASE, str(CHART), "-n", ns, "-f", str(first))
    assert "runs `nsqworker run myservice.tasks`" in notes  # NOTES.txt
    assert "A stop drains for 30 s; pods get 45 s after SIGTERM." in notes

    deployment = apps.read_namespaced_deployment(FULLNAME, ns)
    assert deployment.spec.replicas == 1
    pod = deployment.spec.template.spec
    (container,) = pod.containers
    assert container.image == "registry.example.com/myservice:1.0"
    assert container.command is None and container.args == ["run", "myservice.tasks"]
    assert pod.termination_grace_period_seconds == 45
    assert container.readiness_probe.http_get.path == "/readyz"
    assert container.liveness_probe.http_get.port == "health"
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.capabilities.drop == ["ALL"]
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.service_account_name == FULLNAME
    config = core.read_namespaced_config_map(FULLNAME, ns).data
    assert config["NSQWORKER_WORKERS"] == "1"
    assert config["NSQWORKER_DRAIN_TIMEOUT"] == "30"
    assert (
        core.read_namespaced_service_account(FULLNAME, ns).automount_service_account_token is False
    )
    assert core.read_namespaced_service(FULLNAME, ns).spec.ports[0].port == 8080
    pdb = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(FULLNAME, ns)
    assert pdb.spec.max_unavailable == 1
    checksum = deployment.spec.template.metadata.annotations["checksum/config"]

    second = kube_helm.values_file(
        {
            "tasks": "myservice.tasks",
            "image": {**image, "tag": "1.1"},
            "workers": 3,
            "drainTimeout": 60,
            "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5},
        }
    )
    kube_helm.run("upgrade", RELEASE, str(CHART), "-n", ns, "-f", str(second))
    deployment = apps.read_namespaced_deployment(FULLNAME, ns)
    pod = deployment.spec.template.spec
    assert pod.containers[0].image == "registry.example.com/myservice:1.1"
    assert pod.termination_grace_period_seconds == 75
    assert deployment.spec.template.metadata.annotations["checksum/config"] != checksum
    config = core.read_namespaced_config_map(FULLNAME, ns).data
    assert (config["NSQWORKER_WORKERS"], config["NSQWORKER_DRAIN_TIMEOUT"]) == ("3", "60")
    hpa = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(FULLNAME, ns)
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (2, 5)
    history = json.loads(kube_helm.run("history", RELEASE, "-n", ns, "-o", "json"))
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]

    kube_helm.run("uninstall", RELEASE, "-n", ns)
    for read in (
        apps.read_namespaced_deployment,
        core.read_namespaced_config_map,
        core.read_namespaced_service,
        core.read_namespaced_service_account,
    ):
        wait_for(lambda read=read: gone(read, FULLNAME, ns), timeout=10, message=f"{read.__name__}")
    assert gone(
        client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler, FULLNAME, ns
    )
    assert kube_helm.run("list", "-n", ns, "-q").strip() == ""


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_ci_values_are_accepted_and_stored(kube: Any, kube_helm: Any, values: Path) -> None:
    """A real install of each ci/ file; every object reads back with what was rendered."""
    ns = f"ci-{values.stem.removesuffix('-values')}"
    kube.create_namespace(ns)
    kube.create_namespace("spark-jobs")  # spark-rbac's Role lives there
    rendered = [
        obj
        for obj in kube_helm.template(values, namespace=ns)
        if "helm.sh/hook" not in obj["metadata"].get("annotations", {})
    ]
    kube_helm.run("install", RELEASE, str(CHART), "-n", ns, "-f", str(values))
    try:
        for obj in rendered:
            stored = read_back(kube, obj, ns)
            assert_contains(stored, obj, f"{obj['kind']}/{obj['metadata']['name']}")
    finally:
        kube_helm.run("uninstall", RELEASE, "-n", ns)


def test_the_api_server_refuses_what_the_schema_cannot_see(kube: Any, kube_helm: Any) -> None:
    """The API server is a second check: a label value Kubernetes refuses fails install.

    (Helm's --dry-run=server sends nothing to the API server, so this is a real install.)
    """
    ns = "refused"
    kube.create_namespace(ns)
    values = kube_helm.values_file({"podLabels": {"team": "not a valid label value!"}})
    try:
        with pytest.raises(AssertionError) as refused:
            kube_helm.run("install", RELEASE, str(CHART), "-n", ns, "-f", str(values))
        assert "Deployment.apps" in str(refused.value)
        assert "spec.template.labels: Invalid value" in str(refused.value)
    finally:
        kube_helm.run("uninstall", RELEASE, "-n", ns)


# ---------------------------------------------------------------------------- the pod spec, run


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def resolve_env(
    container: dict[str, Any], namespace: str, pod_name: str, kube: Any
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom, then env in order,
    ``$(VAR)`` expanded from what came before; ConfigMap, Secret and field references read
    from the API server."""
    core = client_module().CoreV1Api(kube.api_client())
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = core.read_namespaced_config_map(source["configMapRef"]["name"], namespace).data
            env.update({prefix + k: v for k, v in (data or {}).items()})
        elif "secretRef" in source:
            data = core.read_namespaced_secret(source["secretRef"]["name"], namespace).data
            env.update({prefix + k: base64.b64decode(v).decode() for k, v in (data or {}).items()})
        else:
            raise AssertionError(f"unknown envFrom source {source}")
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    for var in container.get("env", []):
        if "valueFrom" not in var:
            env[var["name"]] = _VAR.sub(lambda m: env.get(m[1], m[0]), var.get("value", ""))
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            env[var["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in ref:
            secret = core.read_namespaced_secret(ref["secretKeyRef"]["name"], namespace)
            env[var["name"]] = base64.b64decode(secret.data[ref["secretKeyRef"]["key"]]).decode()
        elif "configMapKeyRef" in ref:
            data = core.read_namespaced_config_map(ref["configMapKeyRef"]["name"], namespace).data
            env[var["name"]] = data[ref["configMapKeyRef"]["key"]]
        else:
            raise AssertionError(f"unknown valueFrom {ref}")
    return env


def image_env(dockerfile: Any) -> dict[str, str]:
    """The runtime image's ENV with its paths mapped into this checkout."""
    mapped = {}
    for key, value in dockerfile.env(dockerfile.runtime).items():
        value = value.replace("$PATH", "/usr/local/bin:/usr/bin:/bin")
        value = value.replace("/opt/nsqworker", str(VENV)).replace("/app", str(APP_DIR))
        mapped[key] = value
    return mapped


def test_the_pod_spec_runs_against_nsqd(
    kube: Any, kube_helm: Any, nsqd: NsqdProcess, dockerfile: Any, tmp_path: Path
) -> None:
    client = client_module()
    api = kube.api_client()
    ns = "run"
    kube.create_namespace(ns)
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.create_namespaced_secret(
            ns,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="nsq-auth"), string_data={"secret": "s3cret"}
            ),
        )
    out = tmp_path / "out"
    values = {
        "tasks": "deploytasks",
        "healthPort": free_port(),
        "drainTimeout": 3,
        "nsq": {"lookupdHttpAddresses": [], "nsqdTcpAddresses": [nsqd.tcp_address]},
        # a pod binds 0.0.0.0 and is probed on its IP; tests stay on loopback
        "healthHost": "127.0.0.1",
        "auth": {"existingSecret": "nsq-auth", "key": "secret"},
        "extraEnv": [{"name": "DEPLOY_TEST_OUT", "value": str(out)}],
    }
    kube_helm.run(
        "install", RELEASE, str(CHART), "-n", ns, "-f", str(kube_helm.values_file(values))
    )

    deployment = api.sanitize_for_serialization(
        client.AppsV1Api(api).read_namespaced_deployment(FULLNAME, ns)
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {**image_env(dockerfile), **resolve_env(container, ns, f"{FULLNAME}-7d9f8-abcde", kube)}
    # Kubernetes: command replaces ENTRYPOINT; args replace CMD; command alone drops CMD
    command = container.get("command") or dockerfile.exec_form(dockerfile.runtime, "ENTRYPOINT")
    args = container.get(
        "args", [] if "command" in container else dockerfile.exec_form(dockerfile.runtime, "CMD")
    )
    executable = shutil.which(command[0], path=env["PATH"])
    assert executable == str(VENV / "bin" / "nsqworker"), executable
    (workdir,) = dockerfile.all(dockerfile.runtime, "WORKDIR")
    assert workdir == "/app"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    def probe_url(probe: str) -> str:
        get = container[probe]["httpGet"]
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        return f"http://127.0.0.1:{port}{get['path']}"

    log_path = tmp_path / "pod.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [executable, *command[1:], *args],
            env=env,
            cwd=APP_DIR,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with httpx.Client(trust_env=False, timeout=2.0) as http:

            def answers(url: str) -> bool:
                assert proc.poll() is None, f"exited {proc.returncode}:\n{log_path.read_text()}"
                with contextlib.suppress(httpx.HTTPError):
                    return http.get(url).status_code == 200
                return False

            wait_for(lambda: answers(probe_url("readinessProbe")), timeout=60, message="readiness")
            assert answers(probe_url("livenessProbe"))
            assert answers(probe_url("startupProbe"))
            nsqd.publish("deploy_test", b"hello from the chart")
            wait_for(
                lambda: out.exists() and out.read_bytes() == b"hello from the chart\n",
                timeout=30,
                message=lambda: f"no message consumed; log:\n{log_path.read_text()}",
            )
        # the AUTH secret came from the Secret through the resolved env into Settings
        assert "does not require AUTH" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        grace = pod["terminationGracePeriodSeconds"]
        assert proc.wait(timeout=grace) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        kube_helm.run("uninstall", RELEASE, "-n", ns)

    # the worker processes (and multiprocessing's resource tracker) end with the supervisor
    def group_gone() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_for(group_gone, timeout=5, message="processes of the pod's command outlived it")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
