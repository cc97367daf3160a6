"""A real Kubernetes cluster of one or more nodes for tests, in a network namespace (root).

etcd, kube-apiserver (both from :class:`~nsqworker.testing.kube.KubeControlPlane`),
kube-controller-manager, kube-scheduler and, for each node, a containerd and a kubelet run
inside a network namespace :class:`KubeCluster` makes
(:class:`~nsqworker.testing.netns.NetNamespace`) that holds ``lo`` and nothing else:
127.0.0.1 and node k's address ``10.254.0.k/32``. No bridge, no veth: the CNI network is
loopback only, so **every pod must use ``hostNetwork: true``** (the chart's
``hostNetwork`` value) and runs in that namespace, its address its node's. Ports are the
node's too: one pod of a Deployment per node (the scheduler places no second pod whose
port is taken), so ``nodes=3`` runs three replicas, and a rolling update with surge
starts the new pod on another node. :meth:`KubeCluster.start` and
:meth:`KubeCluster.stop` check that ``lo`` is the namespace's only link
(``ip -n NAME -o link``). A process on a node (nsqd, KEDA) listens on 0.0.0.0 and pods
reach it at ``NODE_IP`` (or 127.0.0.1): all nodes share the namespace. ::

    with KubeCluster(work_dir, nodes=3, podman=["scripts/podman"]) as cluster:
        cluster.load_image("localhost/myservice:1.0")          # from podman's store
        nsqd = cluster.start_process("nsqd", [nsqd_bin, "--tcp-address=0.0.0.0:4150"])
        stats_port = cluster.forward(4151)                     # host 127.0.0.1 -> inside
        subprocess.run(["helm", "install", ..., "--kubeconfig", str(cluster.kubeconfig)])

The kubeconfig's server (``https://127.0.0.1:<port>``) works from the host too: the same
port of the host's loopback is relayed into the namespace, so helm, kubectl and the
``kubernetes`` client run as usual. :meth:`KubeCluster.stop` stops every process by PID
(the pods' too: whatever still runs in the namespace is killed), unmounts what the
kubelet and containerd mounted under the work directory, deletes the namespace, removes
the kubepods cgroups and the fixed host directories they made, puts back the sysctls the
kubelet changed, then checks all that (:meth:`KubeCluster.leftovers`, which also reports
any link besides ``lo`` seen at stop) and raises :class:`KubeClusterError` naming it.

The pytest fixture ``kube_cluster`` (session scope) lives in
:mod:`nsqworker.testing.kube_cluster_plugin`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from nsqworker.testing.kube import Daemon, KubeControlPlane, find_kube_binaries
from nsqworker.testing.kube_cluster_setup import (
    CLUSTER_INSTALL_HINT,
    HOST_PATHS,
    KUBELET_SYSCTLS,
    NODE_IP,
    NODE_NAME,
    SANDBOX_IMAGE,
    ClusterBinaries,
    Node,
    controller_argvs,
    find_cluster_binaries,
    kill_containers,
    kubelet_argv,
    kubepods_cgroups,
    make_cgroup_root,
    mounts_under,
    remove_cgroups,
    unmount_under,
    write_configs,
)
from nsqworker.testing.netns import HostState, NetNamespace, NetNamespaceError

if TYPE_CHECKING:
    import kubernetes.client

__all__ = [
    "CLUSTER_INSTALL_HINT",
    "NODE_IP",
    "NODE_NAME",
    "ClusterBinaries",
    "KubeCluster",
    "KubeClusterError",
    "Node",
    "find_cluster_binaries",
]

READY_TIMEOUT = 120.0
"""Seconds the cluster gets to be schedulable (about 10 s here)."""


class KubeClusterError(RuntimeError):
    """A part did not start, or something was left behind after :meth:`KubeCluster.stop`."""


def _stderr_progress(line: str) -> None:
    print(f"kube_cluster: {line}", file=sys.__stderr__, flush=True)


class KubeCluster:
    """A cluster of ``nodes`` nodes in a network namespace of its own.

    Args:
        work_dir: data, configuration, logs and the kubeconfig; must exist and be
            empty-ish (a temporary directory of the test session). Kept after stop.
        nodes: how many nodes (each a kubelet and a containerd, at ``10.254.0.k``).
        apiserver_args: more kube-apiserver flags (e.g. KEDA's
            :func:`~nsqworker.testing.keda.aggregation_apiserver_args`).
        binaries: see :func:`find_cluster_binaries` (found if None).
        podman: the podman command whose image store :meth:`load_image` reads (the
            sandbox image ``localhost/podman-pause`` comes from it too).
        netns: the namespace's name (refused when it exists).
        progress: called with a line for each step while starting and stopping.
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        nodes: int = 1,
        apiserver_args: Sequence[str] = (),
        binaries: ClusterBinaries | None = None,
        podman: Sequence[str] = ("podman",),
        netns: str = "nsqworker-kube",
        progress: Callable[[str], None] = _stderr_progress,
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ValueError(f"nodes must be 1 to 9, not {nodes}")
        self.work_dir = Path(work_dir)
        self.nodes = [Node(k, self.work_dir) for k in range(1, nodes + 1)]
        """The nodes, in order: ``nodes[0]`` is at ``NODE_IP``."""
        self.apiserver_args = list(apiserver_args)
        self.binaries = binaries
        self.podman = list(podman)
        self.netns = NetNamespace(netns, NODE_IP, [n.ip for n in self.nodes[1:]])
        self.progress = progress
        self.timings: dict[str, float] = {}
        """Seconds each step of :meth:`start` took (``schedulable`` is the total)."""
        self.plane: KubeControlPlane | None = None
        self._daemons: list[Daemon] = []
        self._extra: list[Daemon] = []
        self._host: HostState | None = None
        self._links_at_stop: list[str] = []
        self._t0 = 0.0

    # -- what tests use ----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """An administrator's kubeconfig (``system:masters``), usable inside and outside."""
        return self._plane.kubeconfig

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>`` of the API server (the same port on both sides)."""
        return self._plane.server

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ``kubernetes`` client for the API server (as the administrator)."""
        return self._plane.api_client()

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command that runs inside the namespace (``nsenter --net``)."""
        return self.netns.command(argv)

    def links(self) -> list[str]:
        """The namespace's network links: ``["lo"]`` (anything else is a defect)."""
        return self.netns.links()

    def forward(self, port: int, host_port: int | None = None) -> int:
        """Relay the host's ``127.0.0.1:host_port`` to ``127.0.0.1:port`` inside.

        ``host_port`` None takes a free port; returns the host's port. Connect to
        ``NODE_IP`` ports from inside only (pods, :meth:`command`): a process on the
        node should listen on 0.0.0.0 to be reachable both ways.
        """
        return self.netns.forward(port, host_port)

    def start_process(self, name: str, argv: Sequence[str]) -> Daemon:
        """Start ``argv`` inside the namespace, logging to ``work_dir/logs/NAME.log``.

        It is stopped (SIGTERM, then SIGKILL) by :meth:`stop` before the cluster, or
        earlier by ``daemon.stop()``.
        """
        daemon = self._daemon(name, list(argv))
        self._extra.append(daemon)
        return daemon

    def load_image(self, image: str) -> float:
        """Copy ``image`` from podman's store into every node's containerd (``k8s.io``).

        Pods then run it with ``imagePullPolicy: Never`` (or IfNotPresent). The nodes
        import it at once. Returns the seconds it took (about 15 s for a 420 MB image
        on one node here).

        Raises:
            KubeClusterError: podman or ``ctr`` failed; the message carries its output.
        """
        start = time.monotonic()
        self.progress(f"loading {image} into containerd ({len(self.nodes)} nodes)")
        archive = self.work_dir / "images" / (image.replace("/", "_").replace(":", "_") + ".tar")
        archive.parent.mkdir(parents=True, exist_ok=True)
        archive.unlink(missing_ok=True)
        self._check([*self.podman, "save", "--format", "docker-archive", "-o", str(archive), image])
        try:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                for done in [
                    pool.submit(
                        self._check,
                        [*self.ctr(node), "images", "import", "--digests", str(archive)],
                        timeout=300,
                    )
                    for node in self.nodes
                ]:
                    done.result()
        finally:
            archive.unlink(missing_ok=True)
        seconds = time.monotonic() - start
        self.progress(f"{image} loaded ({seconds:.1f}s)")
        return seconds

    def ctr(self, node: Node | None = None) -> list[str]:
        """The ``ctr`` command for a node's pods' containerd namespace (``k8s.io``);
        the first node's when ``node`` is None."""
        assert self.binaries is not None
        sock = (node or self.nodes[0]).sock
        return [self.binaries.ctr, "--address", str(sock), "-n", "k8s.io"]

    def node_of_ip(self, ip: str) -> Node:
        """The node at ``ip`` (a hostNetwork pod's ``status.podIP``)."""
        for node in self.nodes:
            if node.ip == ip:
                return node
        raise KubeClusterError(f"no node at {ip}")

    def kubectl(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        """Run ``kubectl args`` as the administrator; return stdout.

        Raises:
            KubeClusterError: it exited non-zero (and ``check``); the message has stderr.
        """
        assert self.binaries is not None
        return self._check(
            [self.binaries.kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            timeout=timeout,
            check=check,
        )

    def memory_bytes(self) -> int:
        """Resident memory of every process in the namespace (cluster, pods, nsqd...)."""
        total = 0
        for pid in self.netns.pids():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Make the namespace, start every part, return once a pod can be scheduled.

        Raises:
            FileNotFoundError: a part is missing (one line naming what to install).
            KubeClusterError: a part exited or was not ready in time (with its log).
            NetNamespaceError: the namespace exists already, or holds a link besides ``lo``.
        """
        if self.binaries is None:
            self.binaries = find_cluster_binaries()
        if os.geteuid() != 0:
            raise FileNotFoundError(f"a kubelet needs root (running as uid {os.geteuid()})")
        self._t0 = time.monotonic()
        self._host = HostState(KUBELET_SYSCTLS, HOST_PATHS)
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop(check=False)
            raise
        return self

    def _start(self) -> None:
        assert self.binaries is not None
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.netns.create()
        self.netns.check_lo_only()
        ips = ", ".join(n.ip for n in self.nodes)
        self._step(f"network namespace {self.netns.name} made (lo only: 127.0.0.1, {ips})")
        for node in self.nodes:
            write_configs(node, self.binaries)
            make_cgroup_root(node)
            self._start_daemon(
                f"containerd-{node.index}",
                [self.binaries.containerd, "--config", str(node.dir / "containerd.toml")],
            )
        for node in self.nodes:
            self._wait(
                self._by_name(f"containerd-{node.index}"),
                lambda node=node: self._ok([*self.ctr(node), "version"]),  # type: ignore[misc]
                f"containerd of {node.name} answers",
            )
        self._step(f"containerd started on {len(self.nodes)} node(s)")
        self._ensure_sandbox_image()
        self.load_image(SANDBOX_IMAGE)
        self._step("sandbox image loaded")
        kube_bins = find_kube_binaries(Path(self.binaries.kubectl).parent)
        self.plane = KubeControlPlane(
            binaries=kube_bins,
            work_dir=self.work_dir / "control-plane",
            ready_timeout=READY_TIMEOUT,
            authorization_mode="RBAC",
            command_prefix=self.netns.command([]),
            apiserver_args=[
                f"--advertise-address={NODE_IP}",
                "--allow-privileged=true",
                "--kubelet-preferred-address-types=InternalIP",  # no DNS for the node's name
                *self.apiserver_args,
            ],
            forward=lambda port: self.netns.forward(port, port),
        )
        self.plane.start()
        self._step("etcd and kube-apiserver ready")
        self._start_controllers()
        self._step("controller-manager, scheduler, kubelet started")
        self._wait_schedulable()

    def _start_controllers(self) -> None:
        assert self.binaries is not None and self.plane is not None
        cp = self.plane.work_dir
        assert cp is not None
        kubeconfig = self.plane.kubeconfig
        argvs = controller_argvs(self.binaries, kubeconfig, cp, self.plane.ca_file, self.work_dir)
        for name, argv in argvs.items():
            self._start_daemon(name, argv)
        for node in self.nodes:
            self._start_daemon(
                f"kubelet-{node.index}", kubelet_argv(self.binaries, node, kubeconfig)
            )

    def _wait_schedulable(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api_client())
        names = {n.name for n in self.nodes}

        def listed() -> list[Any]:
            with contextlib.suppress(client.ApiException):
                return [
                    n for n in core.list_node().items if n.metadata and n.metadata.name in names
                ]
            return []

        def nodes_ready() -> bool:
            ready = 0
            for node in listed():
                conditions = (node.status and node.status.conditions) or []
                ready += any(c.type == "Ready" and c.status == "True" for c in conditions)
            return ready == len(names)

        self._wait(None, nodes_ready, f"nodes {', '.join(sorted(names))} Ready")
        self._step(f"{len(names)} node(s) Ready")

        def schedulable() -> bool:
            # the node lifecycle controller removed the not-ready taint, and the
            # service-account controller made the default ServiceAccount
            with contextlib.suppress(client.ApiException):
                core.read_namespaced_service_account("default", "default")
                nodes = listed()
                return len(nodes) == len(names) and not any(
                    n.spec is None or n.spec.taints for n in nodes
                )
            return False

        self._wait(None, schedulable, "node untainted and the default ServiceAccount made")
        self.netns.check_lo_only()
        self._step("schedulable")
        self.timings["schedulable"] = time.monotonic() - self._t0

    def stop(self, check: bool = True) -> None:
        """Stop everything, undo what was changed on the host, then check nothing is left.

        Raises:
            KubeClusterError: (with ``check``) something is left: processes in the
                namespace, mounts under the work directory, the namespace itself,
                cgroups, a changed sysctl, or a link besides ``lo`` in the namespace while
                it ran; the message lists them.
        """
        if self.netns.path.exists():
            with contextlib.suppress(NetNamespaceError):
                self._links_at_stop = [n for n in self.netns.links() if n != "lo"]
        for daemon in reversed(self._extra):
            daemon.stop()
        self._extra.clear()
        by_name = {d.name: d for d in self._daemons}
        kubelets = [f"kubelet-{n.index}" for n in self.nodes]
        for name in (*kubelets, "kube-scheduler", "kube-controller-manager"):
            if name in by_name:
                by_name[name].stop(timeout=5)
        if self.plane is not None:
            self.plane.stop()
        for node in self.nodes:
            if (containerd := by_name.get(f"containerd-{node.index}")) is not None:
                kill_containers(self.ctr(node))
                containerd.stop(timeout=5)
        self._daemons.clear()
        self._kill_namespace()
        unmount_under(self.work_dir)
        with contextlib.suppress(Exception):
            self.netns.delete()
        remove_cgroups()
        if self._host is not None:
            self._host.restore()
        for node in self.nodes:
            node.sock.unlink(missing_ok=True)
        self.progress("stopped")
        if check and (left := self.leftovers()):
            raise KubeClusterError("left behind after stop: " + "; ".join(left))

    def leftovers(self) -> list[str]:
        """What is still there of the cluster: processes, mounts, namespace, cgroups, sysctls,
        and any link besides ``lo`` the namespace held when :meth:`stop` began.

        Empty once :meth:`stop` has done its work.
        """
        left = [f"link {n} in the namespace (only lo may be)" for n in self._links_at_stop]
        left += [f"process {pid} in the namespace" for pid in self.netns.pids()]
        left += [f"mount {m}" for m in mounts_under(self.work_dir)]
        if self.netns.path.exists():
            left.append(f"network namespace {self.netns.path}")
        left += [f"cgroup {p}" for p in kubepods_cgroups()]
        if self._host is not None:
            left += [
                f"sysctl {k} is {now} (was {was})" for k, (was, now) in self._host.changed().items()
            ]
        return left

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- inside ------------------------------------------------------------------------

    @property
    def _plane(self) -> KubeControlPlane:
        if self.plane is None:
            raise KubeClusterError("the cluster was not started; call start()")
        return self.plane

    def _by_name(self, name: str) -> Daemon:
        return next(d for d in self._daemons if d.name == name)

    def _step(self, what: str) -> None:
        elapsed = time.monotonic() - self._t0
        self.timings[what] = elapsed
        self.progress(f"{elapsed:6.1f}s {what}")

    def _daemon(self, name: str, argv: list[str]) -> Daemon:
        return Daemon(
            name, self.netns.command(argv), self.work_dir / "logs" / f"{name}.log", self.work_dir
        )

    def _start_daemon(self, name: str, argv: list[str]) -> Daemon:
        daemon = self._daemon(name, argv)
        self._daemons.append(daemon)
        return daemon

    def _wait(self, daemon: Daemon | None, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not predicate():
            for d in [daemon] if daemon is not None else self._daemons:
                if d is not None and d.exited():
                    raise KubeClusterError(
                        f"{d.name} exited ({d.proc.returncode}) before {what}; log {d.log_path}:\n"
                        + d.log_tail()
                    )
            if time.monotonic() > deadline:
                raise KubeClusterError(
                    f"not {what} within {READY_TIMEOUT:g}s; logs in {self.work_dir}/logs"
                )
            time.sleep(0.1)

    def _check(self, argv: list[str], timeout: float = 120, check: bool = True) -> str:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise KubeClusterError(
                f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result.stdout

    def _ok(self, argv: list[str]) -> bool:
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0

    def _ensure_sandbox_image(self) -> None:  # podman makes it with its first pod
        if self._ok([*self.podman, "image", "exists", SANDBOX_IMAGE]):
            return
        name = f"nsqworker-pause-{os.getpid()}"
        self._check([*self.podman, "pod", "create", "--name", name])
        self._check([*self.podman, "pod", "rm", "--force", name])
        if not self._ok([*self.podman, "image", "exists", SANDBOX_IMAGE]):
            raise KubeClusterError(f"podman made no {SANDBOX_IMAGE} (the pods' sandbox image)")

    def _kill_namespace(self) -> None:  # what still runs there: shims, pods' processes
        deadline = time.monotonic() + 10
        while (pids := self.netns.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
            time.sleep(0.1)
