"""What :class:`~nsqworker.testing.kube_cluster.KubeCluster` runs: binaries and configuration.

The kubelet, kube-controller-manager, kube-scheduler and kubectl come from ``make tools``
(``scripts/install-tools cluster``; found like nsqd by
:func:`~nsqworker.testing.processes.find_binary`); containerd, ``ctr``, runc and the CNI
plugins from the system (Debian: ``apt-get install containerd runc
containernetworking-plugins``).

The CNI network is loopback only (:data:`CNI_CONFIG`): the nodes' namespace holds ``lo``
and nothing else, so every pod runs with ``hostNetwork: true`` (the chart's
``hostNetwork`` value) and shares its node's address and ports: one pod per Deployment
per node. Node k (:class:`Node`) is at ``10.254.0.k`` on that ``lo``, with a kubelet and
a containerd of its own, and keeps its pods' cgroups under a cgroup root of its own
(``/nsqworker-node-k``): a kubelet removes every pod cgroup it does not know under its
root, so nodes sharing one would kill each other's pods. The helpers at the end find and
remove what the kubelets leave on the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nsqworker.testing.kube import find_kube_binaries
from nsqworker.testing.processes import find_binary

__all__ = [
    "CLUSTER_INSTALL_HINT",
    "CNI_CONFIG",
    "HOST_PATHS",
    "KUBELET_SYSCTLS",
    "NODE_IP",
    "NODE_NAME",
    "SANDBOX_IMAGE",
    "ClusterBinaries",
    "Node",
    "controller_argvs",
    "find_cluster_binaries",
    "kill_containers",
    "kubelet_argv",
    "kubepods_cgroups",
    "make_cgroup_root",
    "mounts_under",
    "remove_cgroups",
    "unmount_under",
    "write_configs",
]

NODE_IP = "10.254.0.1"
"""The first node's address, on ``lo`` inside the namespace (the kubelet refuses
127.0.0.1); node k is at ``10.254.0.k``."""
NODE_NAME = "nsqworker-node-1"
"""The first node's name; node k is ``nsqworker-node-k``."""
CGROUP_BASE = Path("/sys/fs/cgroup")
CNI_CONFIG = {
    "cniVersion": "0.4.0",
    "name": "loopback-only",
    "plugins": [{"type": "loopback"}],
}
"""The CNI network: loopback only. Pods run with ``hostNetwork: true`` (see the module)."""
SANDBOX_IMAGE = "localhost/podman-pause:4.3.1-0"
"""The pods' sandbox (pause) image: podman's own, copied from its store (no registry)."""
CNI_DIR = Path("/usr/lib/cni")
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
"""Host sysctls the kubelet sets at start: saved before, written back after."""
HOST_PATHS = ("/var/lib/kubelet", "/run/containerd", "/var/log/containers", "/var/log/pods")
"""Fixed directories the kubelet or containerd make whatever their configuration says."""
CLUSTER_INSTALL_HINT = (
    "`scripts/install-tools cluster` (builds kubelet, kube-controller-manager,"
    " kube-scheduler, kubectl v1.34.4 into .tools/bin; apt-get install containerd runc"
    " containernetworking-plugins, as root)"
)


@dataclass(frozen=True)
class Node:
    """Node ``index`` (1, 2, ...) of a cluster: its name, address and directory."""

    index: int
    work_dir: Path

    @property
    def name(self) -> str:
        """``nsqworker-node-<index>``."""
        return f"nsqworker-node-{self.index}"

    @property
    def ip(self) -> str:
        """``10.254.0.<index>``, on the namespace's ``lo``."""
        return f"10.254.0.{self.index}"

    @property
    def dir(self) -> Path:
        """Its containerd's and kubelet's files: ``work_dir/<name>``."""
        return self.work_dir / self.name

    @property
    def sock(self) -> Path:
        """Its containerd's socket."""
        return self.dir / "run" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot`` (its pods' cgroups are under ``ROOT/kubepods``)."""
        return f"/nsqworker-node-{self.index}"


@dataclass(frozen=True)
class ClusterBinaries:
    """Paths of the executables a cluster runs (etcd and kube-apiserver: beside kubectl)."""

    kubelet: str
    kube_controller_manager: str
    kube_scheduler: str
    kubectl: str
    containerd: str
    ctr: str
    runc: str
    nsenter: str


def find_cluster_binaries(bin_dir: str | os.PathLike[str] | None = None) -> ClusterBinaries:
    """Find every part, or say in one line what to install.

    Raises:
        FileNotFoundError: one is missing; the message names it and how to install it.
    """
    found: dict[str, str] = {}
    for name in ("kubelet", "kube-controller-manager", "kube-scheduler", "kubectl"):
        try:
            found[name.replace("-", "_")] = find_binary(name, bin_dir)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{name} is missing: install it with {CLUSTER_INSTALL_HINT}"
            ) from None
    find_kube_binaries(Path(found["kubectl"]).parent)  # etcd, kube-apiserver beside them
    for name in ("containerd", "ctr", "runc", "nsenter", "ip"):
        path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if path is None:
            raise FileNotFoundError(f"{name} is missing: install it with {CLUSTER_INSTALL_HINT}")
        found[name] = path
    for plugin in ("loopback",):
        if not (CNI_DIR / plugin).is_file():
            raise FileNotFoundError(
                f"the CNI plugin {CNI_DIR / plugin} is missing: install it with {CLUSTER_INSTALL_HINT}"
            )
    found.pop("ip")
    return ClusterBinaries(**found)


def write_configs(node: Node, binaries: ClusterBinaries) -> None:
    """The node's containerd config, CNI network and kubelet config, under ``node.dir``."""
    work_dir = node.dir
    for sub in ("run", "cni/net.d", "kubelet", "pod-logs", "containerd"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    run = work_dir / "run"
    # containerd 1.6: everything under work_dir; root here lacks CAP_SYS_RESOURCE, so
    # runc cannot lower oom_score_adj (restrict_oom_score_adj); cgroupfs; no registry
    (work_dir / "containerd.toml").write_text(
        f"""version = 2
root = "{work_dir}/containerd/root"
state = "{work_dir}/containerd/state"
[grpc]
  address = "{run}/containerd.sock"
[ttrpc]
  address = "{run}/containerd.sock.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{work_dir}/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{SANDBOX_IMAGE}"
    enable_selinux = false
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "{binaries.runc}"
          Root = "{work_dir}/containerd/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{CNI_DIR}"
      conf_dir = "{work_dir}/cni/net.d"
      max_conf_num = 1
"""
    )
    # loopback only: no bridge, no veth, no address for pods (they use hostNetwork: the
    # node's namespace, which holds lo alone); the kubelet wants a CNI config to be Ready
    (work_dir / "cni/net.d/10-loopback-only.conflist").write_text(json.dumps(CNI_CONFIG, indent=2))
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{run}/containerd.sock",
        "address": node.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": node.ip,
        "cgroupRoot": node.cgroup_root,
        "healthzPort": 10248,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": "cluster.local",
        "podLogsDir": str(work_dir / "pod-logs"),
        "registerNode": True,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
    }
    (work_dir / "kubelet.yaml").write_text(json.dumps(kubelet, indent=2))


def mounts_under(root: Path) -> list[str]:
    """Mount points at or under ``root`` (the kubelet's and containerd's)."""
    top = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == top or point.startswith(top + "/"):
            found.append(point)
    return found


def unmount_under(root: Path) -> None:
    """Unmount everything under ``root``, deepest first (lazily when busy)."""
    for _ in range(5):
        mounts = sorted(set(mounts_under(root)), key=len, reverse=True)
        if not mounts:
            return
        for point in mounts:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _hierarchies() -> list[Path]:
    """The cgroup hierarchies: each v1 controller's directory, or the v2 root itself."""
    if not CGROUP_BASE.is_dir():
        return []
    if (CGROUP_BASE / "cgroup.controllers").exists():
        return [CGROUP_BASE]
    return [d for d in CGROUP_BASE.iterdir() if d.is_dir() and not d.is_symlink()]


def make_cgroup_root(node: Node) -> None:
    """Make the node's cgroup root in every hierarchy (the kubelet refuses a missing one).

    A new v1 cpuset cgroup has no CPUs or memory nodes: they are copied from the parent,
    else no process could join the pods' cgroups below it.
    """
    for hierarchy in _hierarchies():
        path = hierarchy / node.cgroup_root.lstrip("/")
        path.mkdir(exist_ok=True)
        for key in ("cpuset.cpus", "cpuset.mems"):
            if (path / key).exists() and not (path / key).read_text().strip():
                (path / key).write_text((hierarchy / key).read_text())


def kubepods_cgroups() -> list[Path]:
    """The kubelets' cgroups: each node's root (``/nsqworker-node-k``) and any
    ``kubepods`` at the top, in each v1 hierarchy or the v2 one."""
    found = []
    for hierarchy in _hierarchies():
        found += sorted(p for p in hierarchy.glob("nsqworker-node-*") if p.is_dir())
        found += [p for p in (hierarchy / "kubepods", hierarchy / "kubepods.slice") if p.is_dir()]
    return found


def remove_cgroups() -> None:
    """Remove the (empty once their processes ended) nodes' cgroups, leaves first."""
    for top in kubepods_cgroups():
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
        for path in [*reversed(dirs), top]:
            with contextlib.suppress(OSError):
                path.rmdir()


def controller_argvs(
    binaries: ClusterBinaries, kubeconfig: Path, control_plane: Path, ca_file: Path, work_dir: Path
) -> dict[str, list[str]]:
    """Command lines of kube-controller-manager and kube-scheduler, by name."""
    kc = str(kubeconfig)
    common = [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}"]
    common += [f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1"]
    common += ["--leader-elect=false", "--profiling=false"]
    return {
        "kube-controller-manager": [
            binaries.kube_controller_manager,
            *common,
            "--secure-port=10257",
            f"--cert-dir={work_dir / 'kcm-certs'}",
            f"--service-account-private-key-file={control_plane / 'sa.key'}",
            f"--root-ca-file={ca_file}",
            # else the node keeps its not-ready taint: the controllers' own accounts
            "--use-service-account-credentials=true",
            "--controllers=*",
        ],
        "kube-scheduler": [
            binaries.kube_scheduler,
            *common,
            "--secure-port=10259",
            f"--cert-dir={work_dir / 'scheduler-certs'}",
        ],
    }


def kubelet_argv(binaries: ClusterBinaries, node: Node, kubeconfig: Path) -> list[str]:
    """The node's kubelet command line (its config from :func:`write_configs`)."""
    return [
        binaries.kubelet,
        f"--config={node.dir / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        f"--root-dir={node.dir / 'kubelet'}",
        f"--cert-dir={node.dir / 'kubelet' / 'pki'}",
    ]


def kill_containers(ctr: Sequence[str]) -> None:
    """SIGKILL and delete every task and container of a containerd (``ctr`` argv with
    its address and namespace): the end of a cluster, no drain."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ctr, *args], capture_output=True, text=True, timeout=30, check=False
        )

    for _ in range(50):
        tasks = run("tasks", "ls", "-q").stdout.split()
        if not tasks:
            break
        for task in tasks:
            run("tasks", "kill", "-s", "SIGKILL", task)
            run("tasks", "delete", "-f", task)
        time.sleep(0.1)
    for container in run("containers", "ls", "-q").stdout.split():
        run("containers", "delete", container)
