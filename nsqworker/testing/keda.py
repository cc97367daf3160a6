"""KEDA's operator and metrics adapter as processes against a test cluster (issue 56).

The real KEDA (``keda-operator`` and ``keda-adapter``, built by ``scripts/install-tools
keda`` from ``github.com/kedacore/keda/v2`` into .tools/bin, its source kept in
.tools/keda-src) runs on the node of a :class:`~nsqworker.testing.kube_cluster.KubeCluster`
(any object with the methods of :class:`KedaHost`) as two processes, not pods, wired as
KEDA's own manifests wire them:

- KEDA's CRDs, applied server-side from the module's ``config/crd`` (its kustomization,
  patches included); the namespace ``keda``, the ServiceAccount ``keda-operator`` and
  KEDA's RBAC (``config/rbac``, ``config/metrics-server``) as released;
- a kubeconfig with a token of that ServiceAccount (TokenRequest): both processes act as
  ``system:serviceaccount:keda:keda-operator``, with only KEDA's rules;
- one CA and one serverAuth+clientAuth certificate in the ``--cert-dir`` of both (the
  adapter's gRPC link to the operator is mutual TLS; the adapter serves HTTPS with it);
- a selector-less Service ``keda/keda-operator-metrics-apiserver`` with an EndpointSlice
  at the node's address, and the APIService ``v1beta1.external.metrics.k8s.io`` whose
  ``caBundle`` is that CA: the API server's aggregator reaches the adapter there.

API aggregation needs kube-apiserver started with front-proxy flags: pass it
:func:`aggregation_apiserver_args` (which writes the front-proxy CA and client
certificate). :meth:`KedaRunner.start` checks that and says so when they are missing. ::

    flags = aggregation_apiserver_args(work_dir / "front-proxy")   # before the cluster
    ...
    with KedaRunner(cluster, work_dir / "keda") as keda:
        helm install ... --set keda.enabled=true ...
        # the chart's ScaledObject becomes Ready; KEDA makes the HPA keda-hpa-<name>
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, Self

import httpx

from nsqworker.testing.keda_setup import (
    ADAPTER_METRICS_PORT,
    ADAPTER_PORT,
    APISERVICE,
    GRPC_PORT,
    KEDA_NAMESPACE,
    KEDA_VERSION,
    OPERATOR_HEALTH_PORT,
    OPERATOR_METRICS_PORT,
    SERVICE_ACCOUNT,
    KedaBinaries,
    aggregation_apiserver_args,
    apiservice_manifests,
    find_keda,
    write_keda_certificates,
)
from nsqworker.testing.kube import Daemon

__all__ = [
    "KEDA_VERSION",
    "KedaBinaries",
    "KedaError",
    "KedaHost",
    "KedaRunner",
    "aggregation_apiserver_args",
    "apiservice_manifests",
    "find_keda",
    "write_keda_certificates",
]

READY_TIMEOUT = 60.0
"""Seconds each step of :meth:`KedaRunner.start` gets (about 2-5 s each here)."""


class KedaError(RuntimeError):
    """KEDA could not be installed or started; the message says where it stopped."""


class KedaHost(Protocol):
    """What :class:`KedaRunner` needs of a cluster (a ``KubeCluster`` has all of it)."""

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def server(self) -> str: ...

    def kubectl(self, *args: str, timeout: float = 60, check: bool = True) -> str: ...

    def start_process(self, name: str, argv: Sequence[str]) -> Daemon: ...

    def forward(self, port: int, host_port: int | None = None) -> int: ...


class KedaRunner:
    """KEDA's operator and metrics adapter on ``host``'s node, wired into its API server.

    Args:
        host: the cluster (see :class:`KedaHost`); its API server must have been started
            with :func:`aggregation_apiserver_args`.
        work_dir: certificates, the token kubeconfig and the applied manifests.
        node_ip: the node's address, where the aggregator reaches the adapter.
        binaries: see :func:`find_keda` (found if None).
    """

    def __init__(
        self,
        host: KedaHost,
        work_dir: str | Path,
        *,
        node_ip: str = "10.254.0.1",
        binaries: KedaBinaries | None = None,
    ) -> None:
        self.host = host
        self.work_dir = Path(work_dir)
        self.node_ip = node_ip
        self.binaries = binaries
        self.timings: dict[str, float] = {}
        """Seconds from :meth:`start` to the end of each step."""
        self.operator: Daemon | None = None
        self.adapter: Daemon | None = None
        self._t0 = 0.0

    @property
    def cert_dir(self) -> Path:
        return self.work_dir / "certs"

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig both processes use (the ServiceAccount's token)."""
        return self.work_dir / "keda-operator.kubeconfig"

    def start(self) -> Self:
        """Install KEDA's CRDs and RBAC, start both processes, register the APIService.

        Returns once ``/apis/external.metrics.k8s.io/v1beta1`` answers through the API
        server. Raises :class:`KedaError` (with the process's log) when a step fails, and
        :class:`FileNotFoundError` when KEDA is not built.
        """
        if self.binaries is None:
            self.binaries = find_keda()
        self._t0 = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._check_aggregation()
            self._install()
            self._start_processes()
            self._register()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the adapter, then the operator (by PID). KEDA's objects stay in the cluster."""
        for daemon in (self.adapter, self.operator):
            if daemon is not None:
                daemon.stop()
        self.adapter = self.operator = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def external_metric(self, namespace: str, scaled_object: str, metric: str) -> dict[str, Any]:
        """The external metric ``metric`` of ``scaled_object``, read through the aggregator."""
        path = (
            f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}"
            f"?labelSelector=scaledobject.keda.sh%2Fname%3D{scaled_object}"
        )
        result: dict[str, Any] = json.loads(self.host.kubectl("get", "--raw", path))
        return result

    # -- steps -------------------------------------------------------------------------

    def _step(self, name: str) -> None:
        self.timings[name] = time.monotonic() - self._t0

    def _check_aggregation(self) -> None:
        out = self.host.kubectl(
            "-n", "kube-system", "get", "configmap", "extension-apiserver-authentication",
            "-o", "json", check=False,
        )  # fmt: skip
        data = json.loads(out).get("data", {}) if out.strip() else {}
        if "requestheader-client-ca-file" not in data:
            raise KedaError(
                "the API server has no front-proxy (aggregation) flags: start it with"
                " nsqworker.testing.keda.aggregation_apiserver_args(dir) among its arguments"
            )

    def _install(self) -> None:
        assert self.binaries is not None
        config = self.binaries.config
        self.host.kubectl("apply", "--server-side", "-k", str(config / "crd"), timeout=120)
        self.host.kubectl(
            "wait", "--for=condition=Established", "crd", "--all",
            f"--timeout={int(READY_TIMEOUT)}s",
        )  # fmt: skip
        self._step("crds")
        files = [
            config / "general" / "namespace.yaml",
            config / "service_account" / "service_account.yaml",
            config / "rbac" / "role.yaml",
            config / "rbac" / "role_binding.yaml",
            config / "rbac" / "aggregate_cluster_roles.yaml",
            config / "metrics-server" / "role.yaml",
            config / "metrics-server" / "role_binding.yaml",
        ]
        self.host.kubectl("apply", *(f"-f={f}" for f in files))
        token = self.host.kubectl(
            "-n", KEDA_NAMESPACE, "create", "token", SERVICE_ACCOUNT, "--duration=6h"
        ).strip()
        self.kubeconfig.write_text(json.dumps(self._kubeconfig(token), indent=2))
        self.kubeconfig.chmod(0o600)
        write_keda_certificates(self.cert_dir, self.node_ip)
        self._step("rbac")

    def _kubeconfig(self, token: str) -> dict[str, Any]:
        import yaml  # type: ignore[import-untyped]

        admin = yaml.safe_load(self.host.kubeconfig.read_text())
        ca = admin["clusters"][0]["cluster"]["certificate-authority"]
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.host.server, "certificate-authority": ca},
                }
            ],
            "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {
                        "cluster": "test",
                        "user": SERVICE_ACCOUNT,
                        "namespace": KEDA_NAMESPACE,
                    },
                }
            ],
            "current-context": "test",
        }

    def _start_processes(self) -> None:
        assert self.binaries is not None
        kc, certs = str(self.kubeconfig), str(self.cert_dir)
        env = [
            "env",
            "WATCH_NAMESPACE=",
            f"POD_NAMESPACE={KEDA_NAMESPACE}",
            f"KEDA_CLUSTER_OBJECT_NAMESPACE={KEDA_NAMESPACE}",
            f"KUBECONFIG={kc}",
        ]
        self.operator = self.host.start_process(
            "keda-operator",
            [
                *env,
                self.binaries.operator,
                f"--kubeconfig={kc}",
                "--leader-elect=false",
                "--zap-log-level=info",
                "--zap-encoder=console",
                f"--metrics-bind-address=127.0.0.1:{OPERATOR_METRICS_PORT}",
                f"--health-probe-bind-address=0.0.0.0:{OPERATOR_HEALTH_PORT}",
                f"--metrics-service-bind-address=127.0.0.1:{GRPC_PORT}",
                f"--cert-dir={certs}",
                "--enable-cert-rotation=false",
            ],
        )
        self.adapter = self.host.start_process(
            "keda-adapter",
            [
                *env,
                self.binaries.adapter,
                f"--kubeconfig={kc}",
                f"--lister-kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--secure-port={ADAPTER_PORT}",
                f"--tls-cert-file={certs}/tls.crt",
                f"--tls-private-key-file={certs}/tls.key",
                f"--cert-dir={certs}",
                f"--client-ca-file={certs}/ca.crt",
                f"--metrics-service-address=127.0.0.1:{GRPC_PORT}",
                f"--port={ADAPTER_METRICS_PORT}",
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
        )
        operator_port = self.host.forward(OPERATOR_HEALTH_PORT)
        self._wait_http(self.operator, f"http://127.0.0.1:{operator_port}/readyz", verify=False)
        self._step("operator ready")
        adapter_port = self.host.forward(ADAPTER_PORT)
        self._wait_http(
            self.adapter,
            f"https://127.0.0.1:{adapter_port}/readyz",
            verify=self.cert_dir / "ca.crt",
        )
        self._step("adapter ready")

    def _wait_http(self, daemon: Daemon, url: str, verify: bool | Path) -> None:
        import ssl

        context: bool | ssl.SSLContext = False
        if isinstance(verify, Path):
            context = ssl.create_default_context(cafile=str(verify))
        deadline = time.monotonic() + READY_TIMEOUT
        with httpx.Client(verify=context, timeout=2, trust_env=False) as http:
            while time.monotonic() < deadline:
                if daemon.exited():
                    raise KedaError(f"{daemon.name} exited:\n{daemon.log_tail()}")
                try:
                    if http.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise KedaError(
            f"{daemon.name} not ready at {url} in {READY_TIMEOUT:.0f}s:\n{daemon.log_tail()}"
        )

    def _register(self) -> None:
        ca_pem = (self.cert_dir / "ca.crt").read_bytes()
        path = self.work_dir / "apiservice.json"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": apiservice_manifests(ca_pem, self.node_ip),
                }
            )
        )
        self.host.kubectl("apply", f"-f={path}")
        out = self.host.kubectl(
            "wait", "--for=condition=Available", f"apiservice/{APISERVICE}",
            f"--timeout={int(READY_TIMEOUT)}s", check=False,
        )  # fmt: skip
        if "condition met" not in out:
            status = self.host.kubectl("get", f"apiservice/{APISERVICE}", "-o", "json", check=False)
            adapter = self.adapter.log_tail() if self.adapter is not None else ""
            raise KedaError(f"APIService {APISERVICE} not Available:\n{status}\n{adapter}")
        self.host.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1")
        self._step("external metrics API")
