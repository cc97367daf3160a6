"""A real Kubernetes control plane for tests: etcd and kube-apiserver on loopback.

No kubelet, scheduler or controllers run: objects are stored, validated (schemas,
admission, CRD structural schemas) and served exactly as by a cluster, but nothing acts
on them. That is what a Helm chart test needs: ``helm install`` against a real API
server, then the objects read back. ::

    with KubeControlPlane() as kube:
        kube.create_namespace("orders")
        subprocess.run(["helm", "install", "orders", "chart/", "--kubeconfig", str(kube.kubeconfig)])
        apps = kubernetes.client.AppsV1Api(kube.api_client())

The binaries come from ``make tools`` (``etcd`` and ``kube-apiserver`` in .tools/bin,
found like nsqd by :func:`~nsqworker.testing.processes.find_binary`). The Python side
needs the ``kubernetes`` client (the ``kubernetes`` extra) and ``cryptography``.

The pytest plugin ``nsqworker.testing`` registers the session fixture
``kube_control_plane``: one running :class:`KubeControlPlane` for the whole session,
stopped at its end. When the binaries or the Python packages are missing, the tests
that use it are skipped, except under ``CI=true`` (or ``CI=1``), where they fail.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

import httpx

from nsqworker.testing.locations import nsq_install_hint, user_bin_dir
from nsqworker.testing.ports import LOOPBACK, free_ports
from nsqworker.testing.processes import find_binary

try:
    import pytest
except ImportError:  # pragma: no cover - the control plane works without pytest
    _HAVE_PYTEST = False
else:
    _HAVE_PYTEST = True

if TYPE_CHECKING:
    import kubernetes.client

__all__ = [
    "Daemon",
    "KubeBinaries",
    "KubeControlPlane",
    "KubeControlPlaneError",
    "find_kube_binaries",
    "require_kube_packages",
]

KUBE_INSTALL_HINT = (
    f"put etcd and kube-apiserver on PATH or in {user_bin_dir()} (NSQWORKER_TOOLS_BIN=DIR"
    " names another directory): etcd from https://github.com/etcd-io/etcd/releases,"
    " kube-apiserver from https://dl.k8s.io/release/v1.34.4/bin/linux/amd64/kube-apiserver"
    " (in a clone of nsqworker, `make tools` builds both)"
)
READY_TIMEOUT = 60.0
"""Seconds etcd and kube-apiserver together get to become ready (about 5-10 s)."""
STOP_TIMEOUT = 10.0
"""Seconds each process gets after SIGTERM before SIGKILL."""
CRD_TIMEOUT = 30.0
"""Seconds a CustomResourceDefinition gets to become Established."""
PORT_ATTEMPTS = 3
USER = "nsqworker-test"


class KubeControlPlaneError(RuntimeError):
    """Raised when etcd or kube-apiserver cannot be started, or a CRD is not accepted."""


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of the etcd and kube-apiserver executables."""

    etcd: str
    kube_apiserver: str


def find_kube_binaries(bin_dir: str | os.PathLike[str] | None = None) -> KubeBinaries:
    """Find etcd and kube-apiserver like :func:`find_binary` finds nsqd.

    Raises:
        FileNotFoundError: one is missing; the message says how to build it.
    """
    try:
        return KubeBinaries(
            etcd=find_binary("etcd", bin_dir), kube_apiserver=find_binary("kube-apiserver", bin_dir)
        )
    except FileNotFoundError as exc:
        raise FileNotFoundError(str(exc).replace(nsq_install_hint(), KUBE_INSTALL_HINT)) from None


_LIVE: set[Daemon] = set()


@atexit.register
def require_kube_packages() -> None:
    """Raise FileNotFoundError naming the first Python package the Kubernetes fixtures
    need (the ``kubernetes`` client, ``cryptography``, ``yaml``) that is missing."""
    for module in ("kubernetes", "cryptography", "yaml"):
        try:
            __import__(module)
        except ImportError:
            raise FileNotFoundError(
                f"the Python package {module} is missing; install the kubernetes extra"
                " and cryptography"
            ) from None


def _kill_leftovers() -> None:
    """Never leave etcd or kube-apiserver behind when the interpreter exits."""
    for daemon in list(_LIVE):
        with contextlib.suppress(Exception):
            daemon.stop(timeout=1.0)


class Daemon:
    """One child process with its output in a log file (appended to), in its own session.

    Stopped by :meth:`stop` (SIGTERM, then SIGKILL after ``timeout``), and at the latest
    when the interpreter exits. :mod:`nsqworker.testing.kube_cluster` starts the cluster's
    other processes with it.
    """

    def __init__(self, name: str, argv: list[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        self._offset = self._log.tell()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # a terminal's Ctrl-C reaches only our caller
        )
        _LIVE.add(self)

    def exited(self) -> bool:
        """True once the process has ended."""
        return self.proc.poll() is not None

    def log_tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines it logged since it started."""
        with contextlib.suppress(OSError), self.log_path.open("rb") as log:
            log.seek(self._offset)
            return "\n".join(log.read().decode("utf-8", "replace").splitlines()[-lines:])
        return ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; close the log."""
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout)
        finally:
            _LIVE.discard(self)
            self._log.close()


class _PortInUse(KubeControlPlaneError):
    pass


class KubeControlPlane:
    """etcd and kube-apiserver on free loopback ports, with a kubeconfig for them.

    The API server authenticates one user by a static bearer token (member of
    ``system:masters``), signs service-account tokens with a key pair made for it,
    keeps its self-signed serving certificate in its own ``--cert-dir`` (which the
    kubeconfig trusts), and authorizes every request (``AlwaysAllow``): tests talk to
    it as a single administrator, the chart's RBAC objects are checked as data, and
    without RBAC there is no bootstrap policy to wait for, so it is ready sooner.

    Args:
        binaries: etcd and kube-apiserver; found with :func:`find_kube_binaries` if None.
        work_dir: where data, certificates, logs and the kubeconfig go; a temporary
            directory (removed by :meth:`stop`) if None.
        ready_timeout: seconds both processes get to become ready.
        authorization_mode: kube-apiserver's ``--authorization-mode``; ``RBAC`` checks
            every request but the administrator's (``system:masters``), so a test can
            act as a service account with only the rules it grants (ready about a
            second later: the bootstrap roles are written first).
        command_prefix: put before each process's command line (a cluster in a network
            namespace passes ``nsenter --net=... --``).
        apiserver_args: more kube-apiserver flags, after the usual ones (a flag given
            twice takes the later value).
        forward: called with each port etcd and kube-apiserver will listen on, before it
            is polled from this process (a cluster in a network namespace forwards the
            same port of the host's loopback into it).
    """

    def __init__(
        self,
        *,
        binaries: KubeBinaries | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        ready_timeout: float = READY_TIMEOUT,
        authorization_mode: str = "AlwaysAllow",
        command_prefix: Sequence[str] = (),
        apiserver_args: Sequence[str] = (),
        forward: Callable[[int], object] | None = None,
    ) -> None:
        self.binaries = binaries
        self.command_prefix = list(command_prefix)
        self.apiserver_args = list(apiserver_args)
        self.forward = forward
        self.authorization_mode = authorization_mode
        self.ready_timeout = ready_timeout
        self._owns_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.token = secrets.token_hex(16)
        self._etcd: Daemon | None = None
        self._apiserver: Daemon | None = None
        self._port: int | None = None
        self._etcd_url = ""

    # -- what tests use ----------------------------------------------------------------

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>`` of the running API server."""
        if self._port is None:
            raise KubeControlPlaneError("the control plane was not started; call start()")
        return f"https://{LOOPBACK}:{self._port}"

    @property
    def pids(self) -> list[int]:
        """Process ids of etcd and kube-apiserver while they run (none once stopped)."""
        return [d.proc.pid for d in (self._etcd, self._apiserver) if d is not None]

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig file whose current context is this API server (token auth)."""
        return self._dir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        """The API server's self-signed certificate bundle, trusted by the kubeconfig."""
        return self._dir / "certs" / "apiserver.crt"

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ``kubernetes`` client for this API server (the kubeconfig's token and CA)."""
        from kubernetes import client

        configuration = client.Configuration(
            host=self.server, api_key={"authorization": f"Bearer {self.token}"}
        )
        configuration.ssl_ca_cert = str(self.ca_file)
        return client.ApiClient(configuration)

    def apply_crds(self, *paths: str | Path) -> None:
        """Create the CustomResourceDefinitions in YAML ``paths``; wait until Established.

        A CRD that exists already is replaced with the file's version, so calling this
        twice is harmless.

        Raises:
            KubeControlPlaneError: a document is not a CRD, or one was not Established
                within ``CRD_TIMEOUT`` seconds (the message carries its conditions).
        """
        import yaml  # type: ignore[import-untyped]
        from kubernetes import client

        api = client.ApiextensionsV1Api(self.api_client())
        names: list[str] = []
        for path in paths:
            with open(path, encoding="utf-8") as file:
                docs = [d for d in yaml.safe_load_all(file) if d]
            for doc in docs:
                if doc.get("kind") != "CustomResourceDefinition":
                    raise KubeControlPlaneError(f"{path}: {doc.get('kind')!r} is not a CRD")
                name = doc["metadata"]["name"]
                try:
                    api.create_custom_resource_definition(doc)
                except client.ApiException as exc:
                    if exc.status != 409:
                        raise KubeControlPlaneError(f"{path}: CRD {name}: {exc.body}") from exc
                    current = api.read_custom_resource_definition(name).metadata
                    assert current is not None
                    doc["metadata"]["resourceVersion"] = current.resource_version
                    api.replace_custom_resource_definition(name, doc)
                names.append(name)
        for name in names:
            self._wait_established(api, name)

    def create_namespace(self, name: str) -> None:
        """Create namespace ``name``; nothing happens when it exists."""
        from kubernetes import client

        api = client.CoreV1Api(self.api_client())
        try:
            api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start etcd, then kube-apiserver; return when ``/readyz`` answers ok.

        Raises:
            FileNotFoundError: a binary is missing (see :func:`find_kube_binaries`).
            KubeControlPlaneError: a process exited or was not ready in time; the
                message carries the end of its log.
        """
        if self._apiserver is not None:
            raise KubeControlPlaneError("the control plane is already running")
        if self.binaries is None:
            self.binaries = find_kube_binaries()
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="kube-"))
        self._write_credentials()
        deadline = time.monotonic() + self.ready_timeout
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._start_etcd(deadline)
                    self._start_apiserver(deadline)
                    break
                except _PortInUse:
                    self._stop_processes()
                    if attempt == PORT_ATTEMPTS:
                        raise
        except BaseException:
            self.stop()
            raise
        self._write_kubeconfig()
        return self

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; remove the work directory if it was made here."""
        try:
            self._stop_processes()
        finally:
            self._port = None
            if self._owns_dir and self.work_dir is not None:
                shutil.rmtree(self.work_dir, ignore_errors=True)
                self.work_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"on port {self._port}" if self._port is not None else "stopped"
        return f"<KubeControlPlane {state}>"

    # -- inside ------------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self.work_dir is None:
            raise KubeControlPlaneError("the control plane was not started; call start()")
        return self.work_dir

    def _write_credentials(self) -> None:
        """The token file and the service-account key pair kube-apiserver is started with."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        (self._dir / "certs").mkdir(parents=True, exist_ok=True)
        # token,user,uid,"groups"
        (self._dir / "tokens.csv").write_text(f'{self.token},{USER},{USER},"system:masters"\n')
        key = ec.generate_private_key(ec.SECP256R1())
        (self._dir / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (self._dir / "sa.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _start_etcd(self, deadline: float) -> None:
        assert self.binaries is not None
        client_port, peer_port = free_ports(2)
        self._etcd_url = f"http://{LOOPBACK}:{client_port}"
        peer = f"http://{LOOPBACK}:{peer_port}"
        data = self._dir / "etcd"
        shutil.rmtree(data, ignore_errors=True)
        if self.forward is not None:
            self.forward(client_port)
        argv = [
            *self.command_prefix,
            self.binaries.etcd,
            "--name=test",
            f"--data-dir={data}",
            f"--listen-client-urls={self._etcd_url}",
            f"--advertise-client-urls={self._etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--unsafe-no-fsync",  # throwaway data: no fsync makes writes ~10x faster
            "--log-level=warn",
        ]
        self._etcd = Daemon("etcd", argv, self._dir / "etcd.log", self._dir)
        self._wait(self._etcd, f"{self._etcd_url}/health", deadline, headers={})

    def _start_apiserver(self, deadline: float) -> None:
        assert self.binaries is not None
        (port,) = free_ports(1)
        if self.forward is not None:
            self.forward(port)
        argv = [
            *self.command_prefix,
            self.binaries.kube_apiserver,
            f"--etcd-servers={self._etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self._dir / 'certs'}",
            f"--token-auth-file={self._dir / 'tokens.csv'}",
            "--anonymous-auth=false",  # only the token's holder gets in
            # AlwaysAllow unless asked (see authorization_mode in the class docstring)
            f"--authorization-mode={self.authorization_mode}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self._dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self._dir / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--enable-priority-and-fairness=false",  # one client; starts sooner
            "--profiling=false",
            *self.apiserver_args,
        ]
        self._apiserver = Daemon(
            "kube-apiserver", argv, self._dir / "kube-apiserver.log", self._dir
        )
        self._port = port
        headers = {"Authorization": f"Bearer {self.token}"}
        self._wait(self._apiserver, f"https://{LOOPBACK}:{port}/readyz", deadline, headers=headers)

    def _wait(self, daemon: Daemon, url: str, deadline: float, headers: dict[str, str]) -> None:
        """Poll ``url`` until it answers 200, ``daemon`` exits or ``deadline`` passes."""
        last = "no answer"
        # the serving certificate does not exist before the server made it: only
        # readiness is polled unverified; the kubeconfig verifies it afterwards
        with httpx.Client(verify=False, trust_env=False, timeout=2.0) as http:
            while True:
                if daemon.exited():
                    self._fail(daemon, f"exited with status {daemon.proc.returncode}")
                try:
                    response = http.get(url, headers=headers)
                    if response.status_code == 200:
                        return
                    last = f"{response.status_code} {response.text.strip()[-300:]}"
                except httpx.HTTPError as exc:
                    last = str(exc) or type(exc).__name__
                if time.monotonic() >= deadline:
                    self._fail(daemon, f"not ready within {self.ready_timeout:g}s ({url}: {last})")
                time.sleep(0.1)

    def _fail(self, daemon: Daemon, what: str) -> None:
        tail = daemon.log_tail()
        error = _PortInUse if "address already in use" in tail else KubeControlPlaneError
        raise error(f"{daemon.name} {what}; log {daemon.log_path}:\n{tail}")

    def _stop_processes(self) -> None:
        for daemon in (self._apiserver, self._etcd):
            if daemon is not None:
                daemon.stop()
        self._apiserver = self._etcd = None

    def _write_kubeconfig(self) -> None:
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": USER, "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": USER, "namespace": "default"},
                }
            ],
            "current-context": "test",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is YAML
        self.kubeconfig.chmod(0o600)

    @staticmethod
    def _wait_established(api: Any, name: str) -> None:
        deadline = time.monotonic() + CRD_TIMEOUT
        conditions: Iterable[Any] = ()
        while time.monotonic() < deadline:
            crd = api.read_custom_resource_definition(name)
            conditions = (crd.status and crd.status.conditions) or ()
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return
            time.sleep(0.1)
        shown = ", ".join(f"{c.type}={c.status} ({c.message})" for c in conditions)
        raise KubeControlPlaneError(f"CRD {name} not Established in {CRD_TIMEOUT:g}s: {shown}")


# ---------------------------------------------------------------------------- pytest plugin

if _HAVE_PYTEST:

    @pytest.fixture(scope="session")
    def kube_control_plane(
        pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[KubeControlPlane]:
        """One etcd + kube-apiserver for the session; skips (fails under CI) when missing."""
        from nsqworker.testing import _in_ci, _skip_missing

        try:
            binaries = find_kube_binaries(pytestconfig.getoption("nsqd_bin_dir", None))
            require_kube_packages()
        except FileNotFoundError as exc:
            if _in_ci():
                pytest.fail(f"CI=true and the control plane cannot start: {exc}", pytrace=False)
            _skip_missing(str(exc))
        plane = KubeControlPlane(binaries=binaries, work_dir=tmp_path_factory.mktemp("kube"))
        plane.start()
        try:
            yield plane
        finally:
            plane.stop()
