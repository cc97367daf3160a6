"""Spark on the real cluster (issue 57): the job image, the pod templates, the worker.

The job image is ``deploy/spark/Dockerfile`` (a JRE and pyspark) plus
``tests/cluster/spark-app``: the pipeline example's job at
``/opt/pipeline/jobs/sessionize.py``, a job that fails at once, and a
``spark-defaults.conf`` with what this cluster needs (``spark.blockManager.port=0``:
executors share their node's ports; ``spark.shuffle.readHostLocalDisk=false``: pods of
one node share an address, not a disk). The pod templates (written by the operator,
``spark_driver_template``/``spark_executor_template``) put driver and executors on the
host network, mount one host directory at the same path in every pod (the job's input
and output, read by the test and the worker), and point the driver at the API server on
127.0.0.1 (no kube-proxy here). The worker is ``nsqworker run`` on the node (inside the
cluster's namespace), with the ``kubernetes-native`` runner.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nsqworker.testing.kube import Daemon
from nsqworker.testing.kube_cluster import NODE_IP, KubeCluster
from tests.cluster.conftest import BUILD_IMAGE, NSQD_TCP, ROOT, TAG

SPARK_APP_REPOSITORY = "localhost/nsqworker-spark-cluster"
JOB_NAMESPACE = "spark-jobs"
DRIVER_SA = "spark"
ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": DRIVER_SA, "namespace": JOB_NAMESPACE},
    "rules": [
        {
            "apiGroups": [""],
            "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
            "verbs": ["create", "get", "list", "watch", "delete", "deletecollection", "patch"],
        }
    ],
}


def build_job_image(spark_image: str, work: Path) -> str:
    """The job image: ``spark_image`` + the example's job, a failing job, the defaults."""
    context = work / "spark-app-context"
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(ROOT / "tests/cluster/spark-app", context)
    shutil.copytree(ROOT / "examples/spark_pipeline/jobs", context / "jobs", dirs_exist_ok=True)
    image = f"{SPARK_APP_REPOSITORY}:{TAG}"
    result = subprocess.run(
        [str(BUILD_IMAGE), image, "--build-arg", f"SPARK_IMAGE={spark_image}", str(context)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if result.returncode:
        raise AssertionError(f"building {image} failed:\n{result.stderr[-3000:]}")
    return image


def templates(data: Path, api_port: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Driver and executor pod templates for this cluster (see the module doc)."""
    volume = {"name": "data", "hostPath": {"path": str(data), "type": "Directory"}}
    mount = {"name": "data", "mountPath": str(data)}
    common = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", "volumes": [volume]}
    driver = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            **common,
            "containers": [
                {
                    "name": "spark-kubernetes-driver",
                    "volumeMounts": [mount],
                    "env": [
                        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
                        {"name": "SPARK_CONF_DIR", "value": "/opt/pipeline/conf"},
                    ],
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                }
            ],
        },
    }
    executor = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            **common,
            "containers": [{"name": "spark-kubernetes-executor", "volumeMounts": [mount]}],
        },
    }
    return driver, executor


@dataclass
class SparkSetup:
    """What the Spark tests share: images, templates, the data directory."""

    cluster: KubeCluster
    image: str
    data: Path
    driver_template: Path
    executor_template: Path
    work: Path

    def start_worker(self, name: str, module: str, env: dict[str, str]) -> Daemon:
        """``nsqworker run module`` on the node with the kubernetes-native runner."""
        nsqworker = str(Path(sys.executable).with_name("nsqworker"))
        settings = {
            "NSQWORKER_SPARK_RUNNER": "kubernetes-native",
            "NSQWORKER_SPARK_IMAGE": self.image,
            "NSQWORKER_SPARK_NAMESPACE": JOB_NAMESPACE,
            "NSQWORKER_SPARK_SERVICE_ACCOUNT": DRIVER_SA,
            "NSQWORKER_SPARK_DRIVER_TEMPLATE": str(self.driver_template),
            "NSQWORKER_SPARK_EXECUTOR_TEMPLATE": str(self.executor_template),
            "NSQWORKER_NSQD_TCP_ADDRESSES": f"{NODE_IP}:{NSQD_TCP}",
            "NSQWORKER_LOOKUPD_HTTP_ADDRESSES": "",
            "NSQWORKER_HEALTH_PORT": "0",
            "NSQWORKER_LOG_FORMAT": "console",
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "PYTHONPATH": f"{ROOT}:{ROOT / 'tests/cluster/app'}",
            **env,
        }
        argv = ["env", *(f"{k}={v}" for k, v in settings.items()), nsqworker, "run", module]
        return self.cluster.start_process(name, argv)

    def chart_values(self) -> dict[str, Any]:
        """The chart's ``spark`` values for the same runner: the native runner, the job
        image and namespace, the driver's account, these pod templates."""
        return {
            "kubernetes": {
                "enabled": True,
                "runner": "native",
                "image": self.image,
                "namespace": JOB_NAMESPACE,
                "serviceAccount": DRIVER_SA,
                "driverTemplate": yaml.safe_load(self.driver_template.read_text()),
                "executorTemplate": yaml.safe_load(self.executor_template.read_text()),
            }
        }

    def driver_pods(self) -> list[Any]:
        """The driver pods in the jobs' namespace (label spark-role=driver)."""
        from kubernetes import client

        core = client.CoreV1Api(self.cluster.api_client())
        return list(
            core.list_namespaced_pod(JOB_NAMESPACE, label_selector="spark-role=driver").items
        )


def setup_spark(cluster: KubeCluster, spark_image: str, work: Path) -> SparkSetup:
    """Build the job image into every node, make the namespace, the driver's service
    account and Role, the data directory and the pod templates."""
    image = build_job_image(spark_image, work)
    cluster.load_image(image)
    for manifest in (
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOB_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": DRIVER_SA, "namespace": JOB_NAMESPACE}},
        ROLE,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": DRIVER_SA, "namespace": JOB_NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DRIVER_SA},
         "subjects": [{"kind": "ServiceAccount", "name": DRIVER_SA, "namespace": JOB_NAMESPACE}]},
    ):  # fmt: skip
        path = work / f"{manifest['kind']}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        cluster.kubectl("apply", "-f", str(path))
    data = work / "spark-data"
    data.mkdir(exist_ok=True)
    data.chmod(0o777)
    driver, executor = templates(data, cluster.server.rpartition(":")[2])
    driver_path, executor_path = work / "driver.yaml", work / "executor.yaml"
    driver_path.write_text(yaml.safe_dump(driver))
    executor_path.write_text(yaml.safe_dump(executor))
    return SparkSetup(cluster, image, data, driver_path, executor_path, work)


class PodLog(threading.Thread):
    """Every pod of the jobs' namespace seen while it runs: name to spark-role."""

    def __init__(self, cluster: KubeCluster) -> None:
        super().__init__(daemon=True)
        from kubernetes import client

        self.core = client.CoreV1Api(cluster.api_client())
        self.seen: dict[str, str] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(Exception):
                for pod in self.core.list_namespaced_pod(JOB_NAMESPACE).items:
                    role = (pod.metadata.labels or {}).get("spark-role", "?")
                    self.seen[pod.metadata.name] = role
            self.halt.wait(0.5)

    def roles(self) -> list[str]:
        """The roles of the pods seen, sorted (``["driver", "executor", ...]``)."""
        return sorted(self.seen.values())

    def stop(self) -> None:
        """End the watch."""
        self.halt.set()
        self.join()


def dead_letters(cluster: KubeCluster, nsq_tail: str, topic: str, count: int) -> list[str]:
    """Read ``count`` messages of ``topic`` (its ``verify`` channel) with nsq_tail."""
    out = subprocess.run(
        cluster.command(
            [nsq_tail, f"--nsqd-tcp-address=127.0.0.1:{NSQD_TCP}", f"--topic={topic}",
             "--channel=verify", f"-n={count}"]
        ),
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if line]
