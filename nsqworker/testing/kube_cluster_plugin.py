"""The pytest fixture ``kube_cluster``: one real one-node cluster for the test session.

Rules for tests that use it (read before adding one):

- **Every test that uses ``kube_cluster`` lives in one test file** (``tests/cluster/
  test_cluster.py`` here). A session fixture is per process, and ``make test`` runs
  pytest-xdist with ``--dist loadfile``: one file runs in one process, so one cluster
  starts; a second file would start a second cluster in another process, which the
  fixture refuses (the namespace ``nsqworker-kube`` exists) and the test errors.
- Each test installs its own release in its own Kubernetes namespace and uninstalls it
  (or deletes the namespace) before it ends: the next test starts from an empty node.
- **Every pod runs with ``hostNetwork: true``** (the chart's ``hostNetwork`` value): the
  cluster's namespace holds only ``lo`` (checked at start and at stop) and the CNI
  network is loopback only, so a pod has no address of its own. Ports are its node's:
  **one replica of a Deployment per node**. The fixture ``kube_cluster_nodes`` (1)
  sets how many nodes start (tests/cluster uses 3: three replicas, rollouts with surge,
  KEDA scaling 1 to 3); ``kube_cluster_apiserver_args`` adds API server flags (KEDA's
  API aggregation).
- A process a test needs on the node (nsqd, KEDA's operator and adapter) is started with
  ``kube_cluster.start_process(name, argv)``: inside the namespace, stopped with the
  cluster; pods reach it at ``NODE_IP`` (it listens on 0.0.0.0), the test through
  ``kube_cluster.forward(port)``.
- The images pods run are copied in with ``kube_cluster.load_image(ref)`` from the store
  of the podman command the fixture ``kube_cluster_podman`` names (``["podman"]``;
  override it in a conftest.py, as tests/cluster does with ``scripts/podman``).

When a part is missing the tests are skipped with one line naming what to install,
except under ``CI=true`` (or ``CI=1``), where they fail. At the end of the session the
cluster is stopped and checked: processes, mounts, the namespace, cgroups, sysctls and
any link besides ``lo``; anything found is an error of the last test's teardown.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nsqworker.testing.kube import require_kube_packages
from nsqworker.testing.kube_cluster import KubeCluster, find_cluster_binaries

__all__ = [
    "kube_cluster",
    "kube_cluster_apiserver_args",
    "kube_cluster_nodes",
    "kube_cluster_podman",
]


@pytest.fixture(scope="session")
def kube_cluster_podman() -> list[str]:
    """The podman command whose image store ``kube_cluster`` loads images from."""
    return ["podman"]


@pytest.fixture(scope="session")
def kube_cluster_nodes() -> int:
    """How many nodes ``kube_cluster`` starts (1; override it in a conftest.py)."""
    return 1


@pytest.fixture(scope="session")
def kube_cluster_apiserver_args() -> list[str]:
    """More kube-apiserver flags for ``kube_cluster`` (none; e.g. KEDA's aggregation)."""
    return []


@pytest.fixture(scope="session")
def kube_cluster(
    pytestconfig: pytest.Config,
    tmp_path_factory: pytest.TempPathFactory,
    kube_cluster_podman: list[str],
    kube_cluster_nodes: int,
    kube_cluster_apiserver_args: list[str],
) -> Iterator[KubeCluster]:
    """A started :class:`KubeCluster`; skips (fails under CI) when a part is missing."""
    import os

    from nsqworker.testing import _in_ci, _skip_missing

    try:
        binaries = find_cluster_binaries(pytestconfig.getoption("nsqd_bin_dir", None))
        if os.geteuid() != 0:
            raise FileNotFoundError("a kubelet needs root: run the cluster tests as root")
        require_kube_packages()
    except FileNotFoundError as exc:
        if _in_ci():
            pytest.fail(f"CI=true and the cluster cannot start: {exc}", pytrace=False)
        _skip_missing(str(exc))
    cluster = KubeCluster(
        tmp_path_factory.mktemp("kube-cluster"),
        nodes=kube_cluster_nodes,
        apiserver_args=kube_cluster_apiserver_args,
        binaries=binaries,
        podman=kube_cluster_podman,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
