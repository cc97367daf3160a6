"""The chart on a real three-node cluster: the ``kube_cluster`` fixture of nsqworker.testing.

The project's image is built as tests/image builds it (``scripts/build-image`` on the
local base, with ``scripts/podman``), then ``tests/cluster/app`` on top of it (one task
that echoes each message to nsqd's topic ``handled``, so what the handlers saw outlives
the pods), and copied into every node's containerd. nsqlookupd, nsqd and (for the NATS
tests) nats-server run on the nodes' network namespace (which holds ``lo`` alone),
listening on every address there: pods, all on the host network (``hostNetwork: true``,
one replica of a release per node), reach them at ``NODE_IP``, the test through a
relayed port of the host's loopback. The API server runs with API aggregation, and the
real KEDA (``keda`` fixture: operator and metrics adapter as processes on the node)
scales the chart's Deployment.

``CLUSTER_TEST_BREAK`` breaks what the tests rely on, to see them fail: ``health-port``
has the service listen on another port than the one the kubelet probes (no pod gets
Ready), ``no-pdb`` renders no PodDisruptionBudget, ``keda-trigger`` names a channel no
one consumes in the ScaledObject (it never scales), ``keda-behavior`` drops the chart's
HPA behavior (scale-down waits Kubernetes' 300 s). ``CLUSTER_TEST_FIGURES=PATH`` writes
the measured figures there as JSON too (an xdist worker's summary is not printed).

Without podman, its base image or the cluster's parts the tests are skipped with one
line saying what to install; under ``CI=true`` they fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from nsqworker.testing import find_binary, wait_for
from nsqworker.testing.ci import in_ci
from nsqworker.testing.keda import KedaRunner, aggregation_apiserver_args, find_keda
from nsqworker.testing.kube_cluster import NODE_IP, KubeCluster
from nsqworker.testing.nats import find_nats_server

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nsqworker"
PODMAN = ROOT / "scripts" / "podman"
BUILD_IMAGE = ROOT / "scripts" / "build-image"
BASE_IMAGE = "localhost/nsqworker-python:bookworm"
TAG = "test-" + hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]  # as tests/image
IMAGE = f"localhost/nsqworker:{TAG}"
APP_REPOSITORY = "localhost/nsqworker-cluster"
INSTALL = "`scripts/install-tools image` (apt-get install podman runc debootstrap, as root)"
NODES = 3
"""Nodes of the cluster: three replicas at once (one per node on the host network)."""
NSQD_TCP, NSQD_HTTP = 4150, 4151
LOOKUPD_TCP, LOOKUPD_HTTP = 4160, 4161
NATS_PORT, NATS_MONITOR = 4222, 8222
TOPIC, CHANNEL, HANDLED = "orders", "cluster", "handled"
BREAK = os.environ.get("CLUSTER_TEST_BREAK", "")
FIGURES: dict[str, str] = {}
"""Measured figures, printed at the end of the run (docs/kubernetes.md quotes them)."""


def _in_ci() -> bool:
    return in_ci()


def _run(argv: list[str], timeout: float = 900) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return result.stdout


@pytest.fixture(scope="session")
def kube_cluster_podman() -> list[str]:
    """Images come from the project's podman store (scripts/podman)."""
    return [str(PODMAN)]


@pytest.fixture(scope="session")
def kube_cluster_nodes() -> int:
    """Three nodes: three replicas, rollouts with surge, KEDA from 1 to 3."""
    return NODES


@pytest.fixture(scope="session")
def kube_cluster_apiserver_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """API aggregation (front-proxy certificates), for KEDA's metrics adapter."""
    return aggregation_apiserver_args(tmp_path_factory.mktemp("front-proxy"))


@pytest.fixture(scope="session")
def keda(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KedaRunner]:
    """The real KEDA's operator and metrics adapter on the node, registered as the
    external metrics API (KEDA's CRDs and RBAC as released)."""
    try:
        binaries = find_keda()
    except FileNotFoundError as exc:
        if _in_ci():
            pytest.fail(f"CI=true and KEDA is missing: {exc}", pytrace=False)
        pytest.skip(str(exc))
    start = time.monotonic()
    with KedaRunner(kube_cluster, tmp_path_factory.mktemp("keda"), binaries=binaries) as runner:
        FIGURES["KEDA start (CRDs, RBAC, operator, adapter, APIService)"] = (
            f"{time.monotonic() - start:.1f} s"
        )
        yield runner


@dataclass(frozen=True)
class AppImage:
    """The test service's image in the cluster: repository and the tags loaded."""

    repository: str
    tag: str
    retag: str


@pytest.fixture(scope="session")
def app_image(kube_cluster: KubeCluster) -> AppImage:
    """The project's image + tests/cluster/app, built and loaded; a second tag of it."""
    reason = None
    if shutil.which("podman") is None:
        reason = f"podman is missing: install it with {INSTALL}"
    elif subprocess.run([str(PODMAN), "image", "exists", BASE_IMAGE], check=False).returncode:
        reason = f"the base image {BASE_IMAGE} is missing: make it with {INSTALL}"
    if reason:
        if _in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    start = time.monotonic()
    _run([str(BUILD_IMAGE), IMAGE])
    app = f"{APP_REPOSITORY}:{TAG}"
    _run(
        [
            str(BUILD_IMAGE),
            app,
            "--build-arg",
            f"NSQWORKER_IMAGE={IMAGE}",
            str(ROOT / "tests/cluster/app"),
        ]
    )
    FIGURES["image build (cached layers)"] = f"{time.monotonic() - start:.1f} s"
    FIGURES["image load into containerd"] = f"{kube_cluster.load_image(app):.1f} s"
    retag = f"{TAG}-v2"
    for node in kube_cluster.nodes:
        _run(
            [*kube_cluster.ctr(node), "images", "tag", "--force", app, f"{APP_REPOSITORY}:{retag}"]
        )
    return AppImage(APP_REPOSITORY, TAG, retag)


@dataclass
class NodeNsqd:
    """nsqd on the node: the broker keeps the truth the tests check."""

    cluster: KubeCluster
    http: httpx.Client
    nsq_tail: str
    read: list[str] = field(default_factory=list)

    def post(self, path: str, **params: str) -> httpx.Response:
        """POST nsqd's HTTP API; raises on an error status."""
        response = self.http.post(path, params=params)
        response.raise_for_status()
        return response

    def publish(self, body: str, topic: str = TOPIC) -> None:
        """One message to ``topic``."""
        self.http.post("/pub", params={"topic": topic}, content=body).raise_for_status()

    def mpublish(self, bodies: list[str], topic: str = TOPIC) -> None:
        """Many messages to ``topic`` (``/mpub``, a thousand a request)."""
        for i in range(0, len(bodies), 1000):
            content = "\n".join(bodies[i : i + 1000])
            self.http.post("/mpub", params={"topic": topic}, content=content).raise_for_status()

    def channel(self, topic: str = TOPIC, channel: str = CHANNEL) -> dict[str, Any]:
        """The channel's entry of ``/stats`` (empty when it does not exist)."""
        stats = self.http.get("/stats", params={"format": "json", "topic": topic}).json()
        for t in stats.get("topics", []):
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
        return {}

    def finished(self, topic: str = TOPIC, channel: str = CHANNEL) -> int:
        """FINs nsqd counted on the channel (its clients' finish counts)."""
        return sum(c["finish_count"] for c in self.channel(topic, channel).get("clients", []))

    def reset(self) -> None:
        """Empty topics: ``orders``/``cluster`` and ``handled`` with a ``verify`` channel."""
        self.read.clear()
        for topic in (TOPIC, HANDLED):
            with contextlib.suppress(httpx.HTTPStatusError):
                self.post("/topic/delete", topic=topic)
        for topic, channel in ((TOPIC, CHANNEL), (HANDLED, "verify")):
            self.post("/topic/create", topic=topic)
            self.post("/channel/create", topic=topic, channel=channel)

    def drained(self, published: int) -> bool:
        """Every message published to ``orders`` was delivered and answered."""
        c = self.channel()
        return (
            bool(c)
            and c["message_count"] >= published
            and c["depth"] == 0
            and c["in_flight_count"] == 0
        )

    def handled_bodies(self) -> list[str]:
        """Every body the handlers echoed to ``handled`` so far, duplicates included.

        Reading takes them off the ``verify`` channel: each call reads what waits there
        now and adds it to what earlier calls read (``reset`` forgets them)."""
        waiting = self.channel(HANDLED, "verify").get("depth", 0)
        if waiting:
            out = subprocess.run(
                self.cluster.command(
                    [
                        self.nsq_tail,
                        f"--nsqd-tcp-address=127.0.0.1:{NSQD_TCP}",
                        f"--topic={HANDLED}",
                        "--channel=verify",
                        f"-n={waiting}",
                    ]
                ),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            self.read.extend(line for line in out.splitlines() if line)
        return list(self.read)


@pytest.fixture(scope="session")
def node_nsqd_session(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeNsqd]:
    """One nsqlookupd and one nsqd (registered with it) inside the cluster's namespace."""
    nsqd = find_binary("nsqd")
    nsq_tail = find_binary("nsq_tail")
    data = tmp_path_factory.mktemp("node-nsqd")
    kube_cluster.start_process(
        "nsqlookupd",
        [
            find_binary("nsqlookupd"),
            f"--tcp-address=0.0.0.0:{LOOKUPD_TCP}",
            f"--http-address=0.0.0.0:{LOOKUPD_HTTP}",
            f"--broadcast-address={NODE_IP}",
        ],
    )
    kube_cluster.start_process(
        "nsqd",
        [
            nsqd,
            f"--tcp-address=0.0.0.0:{NSQD_TCP}",
            f"--http-address=0.0.0.0:{NSQD_HTTP}",
            f"--broadcast-address={NODE_IP}",
            f"--lookupd-tcp-address=127.0.0.1:{LOOKUPD_TCP}",
            f"--data-path={data}",
        ],
    )
    port = kube_cluster.forward(NSQD_HTTP)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10) as http:

        def pong() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return http.get("/ping").status_code == 200
            return False

        wait_for(pong, timeout=20, message="nsqd on the node answers /ping")
        yield NodeNsqd(kube_cluster, http, nsq_tail)


@pytest.fixture
def node_nsqd(node_nsqd_session: NodeNsqd) -> NodeNsqd:
    """The node's nsqd with empty ``orders`` and ``handled`` topics."""
    node_nsqd_session.reset()
    return node_nsqd_session


@dataclass
class NodeNats:
    """nats-server with JetStream on the node; ``url`` from the host (relayed port)."""

    url: str
    cli: str
    cluster: KubeCluster

    def nats(self, *args: str) -> str:
        """The ``nats`` CLI inside the namespace, against the node's server."""
        argv = [self.cli, f"--server=nats://127.0.0.1:{NATS_PORT}", *args]
        result = subprocess.run(
            self.cluster.command(argv), capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            raise AssertionError(
                f"nats {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result.stdout

    def consumer(self, stream: str, name: str) -> dict[str, Any]:
        """``nats consumer info --json``: the broker's own pending and ack-pending."""
        info: dict[str, Any] = json.loads(self.nats("consumer", "info", stream, name, "--json"))
        return info


@pytest.fixture(scope="session")
def node_nats(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> NodeNats:
    """nats-server on the node (JetStream, monitoring port for KEDA's trigger)."""
    try:
        server, cli = find_nats_server(), find_binary("nats")
    except FileNotFoundError as exc:
        if _in_ci():
            pytest.fail(f"CI=true and NATS is missing: {exc}", pytrace=False)
        pytest.skip(f"{exc}: `scripts/install-tools nats` builds nats-server and the nats CLI")
    store = tmp_path_factory.mktemp("node-nats")
    kube_cluster.start_process(
        "nats-server",
        [
            server,
            "-js",
            "-a",
            "0.0.0.0",
            "-p",
            str(NATS_PORT),
            "-m",
            str(NATS_MONITOR),
            "-sd",
            str(store),
        ],
    )
    port = kube_cluster.forward(NATS_PORT)
    node = NodeNats(f"nats://127.0.0.1:{port}", cli, kube_cluster)

    def up() -> bool:
        with contextlib.suppress(AssertionError):
            return "JetStream" in node.nats("account", "info")
        return False

    wait_for(up, timeout=30, message="nats-server on the node answers with JetStream")
    return node


@dataclass
class Release:
    """One helm release of the chart in its own Kubernetes namespace."""

    helm: str
    env: dict[str, str]
    name: str
    namespace: str
    home: Path
    files: list[Path] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 120) -> str:
        """``helm args`` against the cluster; returns stdout."""
        result = subprocess.run(
            [self.helm, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result.stdout

    def _values(self, values: dict[str, Any]) -> str:
        path = self.home / f"values-{len(self.files)}.yaml"
        path.write_text(yaml.safe_dump(values))
        self.files.append(path)
        return str(path)

    def install(self, values: dict[str, Any]) -> None:
        """``helm install`` (no --wait: the test waits for what it checks)."""
        self.run(
            "install",
            self.name,
            str(CHART),
            "-n",
            self.namespace,
            "--create-namespace",
            "-f",
            self._values(values),
        )

    def upgrade(self, values: dict[str, Any]) -> None:
        """``helm upgrade`` with ``values`` (complete: not merged with the last ones)."""
        self.run("upgrade", self.name, str(CHART), "-n", self.namespace, "-f", self._values(values))


@pytest.fixture
def release(
    kube_cluster: KubeCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Release]:
    """A release named after the test, uninstalled and its namespace deleted at the end."""
    try:
        helm = find_binary("helm")
    except FileNotFoundError as exc:
        if _in_ci():
            pytest.fail(f"CI=true and helm is missing: {exc}", pytrace=False)
        pytest.skip(f"helm is missing ({exc}): `make tools` builds it")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
        "KUBECONFIG": str(kube_cluster.kubeconfig),
    }
    name = request.node.name.removeprefix("test_").replace("_", "-")[:30].strip("-")
    rel = Release(helm, env, name, name, tmp_path)
    yield rel
    # no grace: the next test wants an empty node, not drained pods
    for what in (("pods", "--all"), ("namespace", rel.namespace)):
        kube_cluster.kubectl(
            "delete",
            *what,
            "-n",
            rel.namespace,
            "--grace-period=0",
            "--force",
            "--wait=true",
            "--ignore-not-found",
            timeout=120,
            check=False,
        )


def base_values(image: AppImage, tag: str | None = None, **more: Any) -> dict[str, Any]:
    """Values for the test service on this cluster: image from containerd, nsqd on the
    node, one replica on the host network (the namespace has only ``lo``), the chart's
    own rollout strategy (the new pod starts on another node before the old one stops)."""
    env = [{"name": "HANDLED_NSQD_HTTP", "value": f"{NODE_IP}:{NSQD_HTTP}"}]
    if BREAK == "health-port":  # the kubelet probes 8080, the service listens on 8090
        env.append({"name": "NSQWORKER_HEALTH_PORT", "value": "8090"})
    values: dict[str, Any] = {
        "image": {"repository": image.repository, "tag": tag or image.tag, "pullPolicy": "Never"},
        "nsq": {"lookupdHttpAddresses": [], "nsqdTcpAddresses": [f"{NODE_IP}:{NSQD_TCP}"]},
        "drainTimeout": 5,
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
        "extraEnv": env,
        "replicaCount": 1,
        "hostNetwork": True,
    }
    values.update(more)
    if BREAK == "no-pdb":
        values["podDisruptionBudget"] = {"enabled": False}
    return values


@pytest.fixture(scope="session")
def spark(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The Spark job image (deploy/spark/Dockerfile + tests/cluster/spark-app) in every
    node, the jobs' namespace with the driver's service account, the pod templates
    (a :class:`tests.cluster.spark.SparkSetup`)."""
    from tests.cluster.spark import setup_spark
    from tests.spark_image import SPARK_IMAGE, build_spark_image

    start = time.monotonic()
    build_spark_image(SPARK_IMAGE)
    setup = setup_spark(kube_cluster, SPARK_IMAGE, tmp_path_factory.mktemp("spark"))
    FIGURES["Spark job images built and loaded into the nodes"] = (
        f"{time.monotonic() - start:.1f} s"
    )
    return setup


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the figures to ``CLUSTER_TEST_FIGURES`` when set (from the xdist worker)."""
    if FIGURES and (path := os.environ.get("CLUSTER_TEST_FIGURES")):
        Path(path).write_text(json.dumps(FIGURES, indent=1))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the figures measured on the cluster (docs/kubernetes.md quotes them)."""
    if FIGURES:
        terminalreporter.write_sep("-", "kubernetes cluster figures")
        for what, value in FIGURES.items():
            terminalreporter.write_line(f"{what}: {value}")
