"""The Helm chart's pod, with the real image, under ``podman kube play``.

``helm template`` renders the chart with ``ci/podman-values.yaml`` (the service image
from examples/docker, no ``tasks``: its CMD runs); the ConfigMap and the Deployment go
to ``podman kube play``, which makes the Deployment's pod template a pod. podman 4.3
cannot read three things of that pod spec, so :func:`for_podman` changes exactly these:

1. ``ports`` are dropped and the probes' named port becomes its number: the pod runs on
   the host's network (how it reaches nsqd on 127.0.0.1), where podman refuses port
   mappings and the container's port is the host's.
2. ``fieldRef: metadata.namespace`` becomes the namespace rendered for: podman resolves
   ``metadata.name`` (the pod's name) but no namespace.
3. ``$(VAR)`` references in env values are expanded as the kubelet does; podman passes
   them through literally.

Stopping: podman 4.3's ``kube down`` stops a pod with a timeout of 0 (SIGKILL right
after SIGTERM: no drain; the exit status is 137). So the test does the kubelet's part
first, ``podman pod stop --time <terminationGracePeriodSeconds>``, and ``kube down`` then
removes the stopped pod.

What podman reads differently, left as rendered: the readiness and startup probes
(ignored: the test polls the readiness probe's path and port, as the kubelet would), the
liveness probe (made a ``curl`` healthcheck run by systemd timers, which these machines
lack: podman logs that it cannot add them), ``emptyDir`` (a volume podman removes with
the pod). The security context is applied: the test reads back the user, the read-only
root and the capabilities.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from nsqworker.testing import NsqdProcess, free_port, wait_for

if TYPE_CHECKING:
    from tests.image.conftest import Built, Podman

pytestmark = pytest.mark.timeout(600)  # the first test builds the images (uv downloads cold)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nsqworker"
CI_VALUES = CHART / "ci" / "podman-values.yaml"
NAMESPACE = "orders"


def helm_template(
    helm: str, tmp_path: Path, release: str, values: dict[str, Any]
) -> list[dict[str, Any]]:
    """``helm template`` of the chart as ``release`` with the ci file and ``values``, parsed."""
    override = tmp_path / "values.yaml"
    override.write_text(yaml.safe_dump(values))
    home = tmp_path / "helm"
    env = {"HOME": str(home), "HELM_CONFIG_HOME": str(home), "HELM_CACHE_HOME": str(home)}
    out = subprocess.run(
        [
            helm,
            "template",
            release,
            str(CHART),
            "-n",
            NAMESPACE,
            "-f",
            str(CI_VALUES),
            "-f",
            str(override),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def for_podman(deployment: dict[str, Any]) -> dict[str, Any]:
    """The Deployment with the three changes the module docstring lists (a copy)."""
    deployment = yaml.safe_load(yaml.safe_dump(deployment))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container.pop("ports")}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        get["port"] = ports.get(get["port"], get["port"])
    resolved: dict[str, str] = {}
    for var in container["env"]:
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.namespace":
            del var["valueFrom"]
            var["value"] = NAMESPACE
        if "value" in var:
            # $(NAME) of a variable defined above; anything else stays as written
            var["value"] = re.sub(
                r"\$\((\w+)\)", lambda m: resolved.get(m[1], m[0]), str(var["value"])
            )
            resolved[var["name"]] = var["value"]
        elif field == "metadata.name":
            resolved[var["name"]] = f"{deployment['metadata']['name']}-pod-0"
    return deployment


def test_the_charts_pod_runs_consumes_and_drains_when_stopped(
    podman: Podman, service_image: Built, nsqd: NsqdProcess, helm: str, tmp_path: Path
) -> None:
    port = free_port()
    image = service_image.tag.rsplit(":", 1)
    values = {
        "image": {"repository": image[0], "tag": image[1]},
        "healthPort": port,
        "nsq": {"nsqdTcpAddresses": [nsqd.tcp_address]},
    }
    # a release (and so a pod) name of its own: other checkouts may play theirs at once
    rendered = helm_template(helm, tmp_path, f"orders-{uuid.uuid4().hex[:6]}", values)
    configmap = next(d for d in rendered if d["kind"] == "ConfigMap")
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    (rendered_container,) = pod_spec["containers"]
    assert rendered_container["image"] == service_image.tag
    play = tmp_path / "play.yaml"
    play.write_text(yaml.safe_dump_all([configmap, for_podman(deployment)]))
    pod = f"{deployment['metadata']['name']}-pod-0"  # podman's name for replica 0
    container = f"{pod}-{rendered_container['name']}"

    nsqd.create_channel("clicks", "archive")
    total = 5000
    podman.run("kube", "play", "--network", "host", str(play))
    try:
        # the pod spec's security context, as podman applied it
        state = podman.inspect(container)
        security = pod_spec["securityContext"]
        assert state["Config"]["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"
        assert state["HostConfig"]["ReadonlyRootfs"] is True
        assert state["EffectiveCaps"] in (None, [])
        env = dict(e.split("=", 1) for e in state["Config"]["Env"])
        assert env["NSQWORKER_NSQD_TCP_ADDRESSES"] == nsqd.tcp_address  # from the ConfigMap
        assert env["OTEL_RESOURCE_ATTRIBUTES"].startswith(
            f"k8s.pod.name={pod},k8s.namespace.name={NAMESPACE},"
        )
        readiness = rendered_container["readinessProbe"]["httpGet"]
        assert (readiness["path"], readiness["port"]) == ("/readyz", "health")
        podman.wait_ready(container, port)

        nsqd.mpublish("clicks", [f'{{"click": {i}}}' for i in range(total)])
        wait_for(
            lambda: podman.logs(container).count('"event": "click"') >= 50,
            timeout=30,
            message=lambda: f"no click consumed:\n{podman.logs(container)}",
        )
        # the kubelet's part: SIGTERM, then SIGKILL after the pod's grace period
        grace = pod_spec["terminationGracePeriodSeconds"]
        start = time.monotonic()
        podman.run("pod", "stop", "--time", str(grace), pod, timeout=grace + 30)
        seconds = time.monotonic() - start
        code = podman.inspect(container)["State"]["ExitCode"]
        logs = podman.logs(container)
        podman.run("kube", "down", str(play), timeout=60)
        assert podman.run("pod", "exists", pod, check=False).returncode == 1
    finally:
        podman.run("kube", "down", str(play), check=False)

    assert code == 0, f"exit status {code}:\n{logs[-3000:]}"
    assert seconds < grace, f"the pod took {seconds:.1f}s of its {grace}s to stop"

    def settled() -> dict[str, Any] | None:
        stats = nsqd.channel_stats("clicks", "archive")
        if stats is None or (stats["in_flight_count"], stats["deferred_count"]) != (0, 0):
            return None
        return stats

    # nsqd may read the worker's last FIN and REQ a moment after the container exited (on
    # a loaded machine). A message the drain really left in flight would stay there for
    # nsqd's 60 s msg_timeout, so waiting 10 s still catches it.
    stats = wait_for(
        settled,
        timeout=10,
        message=lambda: f"left in flight or deferred: {nsqd.channel_stats('clicks', 'archive')}",
    )
    handled = re.findall(r'\\"click\\": (\d+)}', logs)
    assert len(handled) == len(set(handled)), "a click was handled twice"
    assert len(handled) + stats["depth"] == total, (len(handled), stats)
    print(f"pod stopped in {seconds:.1f}s: {len(handled)} handled, {stats['depth']} left")
