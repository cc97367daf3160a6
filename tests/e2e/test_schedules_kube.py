"""Scheduled tasks elected on a real kube-apiserver (etcd + kube-apiserver with RBAC on),
each supervisor acting as a service account with the Role the chart renders:

* three ``nsqworker run`` supervisors on NSQ, a per-second schedule, the leader's process
  group SIGKILLed mid-run: every second handled, a duplicate only at the kill;
* a deploy: three old supervisors, three new ones started before the old stop;
* a service account that may not write the Lease: a clear error, nothing fired.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from nsqworker.schedules.cron import format_tick, parse_tick
from nsqworker.testing import _in_ci, wait_for
from nsqworker.testing.holds import holds
from nsqworker.testing.kube import KubeControlPlane, find_kube_binaries
from nsqworker.testing.processes import find_binary

from .test_schedules_run import (
    TICK_TASKS,
    TIMINGS,
    handled,
    holder_pid,
    kill_the_leader_and_check,
    seconds,
    takeover_seconds,
)

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nsqworker"
Start = Callable[..., Any]


@pytest.fixture(scope="module")
def rbac_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeControlPlane]:
    """A control plane of this module's own, with RBAC on (the session's allows all)."""
    try:
        binaries = find_kube_binaries()
        import kubernetes  # noqa: F401
    except (FileNotFoundError, ImportError) as exc:
        if _in_ci():
            pytest.fail(f"CI=true and the control plane cannot start: {exc}", pytrace=False)
        pytest.skip(str(exc))
    plane = KubeControlPlane(
        binaries=binaries,
        work_dir=tmp_path_factory.mktemp("kube-rbac"),
        authorization_mode="RBAC",
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def chart_rules(lease: str) -> list[dict[str, Any]]:
    """The rules of the Role the chart renders for schedules with Lease ``lease``."""
    out = subprocess.run(
        [
            find_binary("helm"), "template", "r", str(CHART),
            "-f", str(CHART / "ci" / "schedules-values.yaml"),
            "--set", f"schedules.leaseName={lease}",
        ],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    roles = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Role"]
    assert len(roles) == 1, roles
    return list(roles[0]["rules"])


def account_kubeconfig(
    kube: KubeControlPlane, namespace: str, account: str, rules: list[dict[str, Any]], path: Path
) -> Path:
    """A kubeconfig acting as service account ``account`` of ``namespace``, bound to a
    Role with ``rules``; its context's namespace is ``namespace``."""
    from kubernetes import client

    kube.create_namespace(namespace)
    api = kube.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": account}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "t",
                "cluster": {"server": kube.server, "certificate-authority": str(kube.ca_file)},
            }
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": "t", "context": {"cluster": "t", "user": account, "namespace": namespace}}
        ],
        "current-context": "t",
    }
    path.write_text(json.dumps(config))
    return path


def lease_holder(kube: KubeControlPlane, namespace: str, name: str) -> str | None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        lease = client.CoordinationV1Api(kube.api_client()).read_namespaced_lease(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease.spec.holder_identity


def kube_env(kubeconfig: Path, topic: str, lease: str) -> dict[str, str]:
    return {
        **TIMINGS,
        "TICK_TOPIC": topic,
        "KUBECONFIG": str(kubeconfig),
        "NSQWORKER_SCHEDULE_LEADER": "kubernetes",
        "NSQWORKER_SCHEDULE_LEASE_NAME": lease,
    }


def test_three_supervisors_fire_each_second_once_across_a_leader_kill(
    supervise: Start,
    write_module: Callable[[str, str], str],
    rbac_kube: KubeControlPlane,
    nsqd: Any,
    tmp_path: Path,
) -> None:
    lease = "ticks-kill"
    config = account_kubeconfig(rbac_kube, "kill", "worker", chart_rules(lease), tmp_path / "kc")
    module = write_module("kube_ticks", TICK_TASKS)
    env = kube_env(config, "ticks_kill", lease)
    args = (module, "--nsqd", nsqd.tcp_address, "--workers", "1")
    runs = [supervise(*args, env=env) for _ in range(3)]

    def leader() -> int | None:
        wait_for(lambda: lease_holder(rbac_kube, "kill", lease), 30)
        return holder_pid(lease_holder(rbac_kube, "kill", lease))

    result = kill_the_leader_and_check(runs, tmp_path / "handled.txt", leader, lease=4)
    output = "\n".join(r.output() for r in runs)
    assert "leader kubernetes (NSQWORKER_SCHEDULE_LEADER) on Lease kill/ticks-kill" in output
    takeover = min(takeover_seconds(r.output(), result["killed"]) for r in runs)
    print(f"takeover {takeover:.1f} s after the kill; doubled {result['doubled']}")
    assert takeover <= 4 + 0.5 + 3, takeover  # lease + retry, and slack for a loaded CI


def test_a_deploy_overlap_fires_every_tick_once(
    supervise: Start,
    write_module: Callable[[str, str], str],
    rbac_kube: KubeControlPlane,
    nsqd: Any,
    tmp_path: Path,
) -> None:
    lease = "ticks-deploy"
    config = account_kubeconfig(rbac_kube, "deploy", "worker", chart_rules(lease), tmp_path / "kc")
    module = write_module("deploy_ticks", TICK_TASKS)
    env = kube_env(config, "ticks_deploy", lease)
    args = (module, "--nsqd", nsqd.tcp_address, "--workers", "1")
    path = tmp_path / "handled.txt"
    old = [supervise(*args, env=env) for _ in range(3)]
    for run in old:
        run.wait_ready()
    wait_for(lambda: len(handled(path)) >= 3, 30, message=lambda: old[0].output())
    new = [supervise(*args, env=env) for _ in range(3)]
    for run in new:
        run.wait_ready()
    for run in old:  # the rollout stops the old ReplicaSet's pods
        run.signal(signal.SIGTERM)
    for run in old:
        assert run.wait(20) == 0, run.output()
    stopped = format_tick(parse_tick(max(handled(path))))
    wait_for(lambda: len([t for t in handled(path) if t > stopped]) >= 4, 30,
             message=lambda: new[0].output())  # fmt: skip
    holder = holder_pid(lease_holder(rbac_kube, "deploy", lease))
    assert holder in {r.proc.pid for r in new}, holder
    for run in new:
        run.signal(signal.SIGTERM)
    for run in new:
        assert run.wait(20) == 0, run.output()
    seen = handled(path)
    assert sorted(seen) == seconds(min(seen), max(seen)), "a tick was lost"
    assert all(len(ids) == 1 for ids in seen.values()), {
        t: i for t, i in seen.items() if len(i) > 1
    }


def test_a_lease_the_worker_may_not_write_is_an_error_and_nothing_fires(
    supervise: Start,
    write_module: Callable[[str, str], str],
    rbac_kube: KubeControlPlane,
    nsqd: Any,
    tmp_path: Path,
) -> None:
    read_only = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]
    config = account_kubeconfig(rbac_kube, "denied", "worker", read_only, tmp_path / "kc")
    module = write_module("denied_ticks", TICK_TASKS)
    run = supervise(module, "--nsqd", nsqd.tcp_address, env=kube_env(config, "ticks_denied", "d"))
    run.wait_ready()
    wait_for(lambda: "schedules will not fire" in run.output(), 30, message=run.output)
    errors = [json.loads(line) for line in run.output().splitlines() if "will not fire" in line]
    assert len(errors) == 1, errors  # said once, not per retry
    assert errors[0]["level"] == "error"
    assert (
        "the worker may not create Lease denied/d (403" in errors[0]["event"]
        and "grant its service account get, create and update on leases.coordination.k8s.io"
        in errors[0]["event"]
    ), errors[0]["event"]
    # a few more tries (retry period 0.5 s): still nothing may fire
    holds(lambda: handled(tmp_path / "handled.txt") == {}, 3.0, "a tick fired without a Lease")
    assert lease_holder(rbac_kube, "denied", "d") is None
    assert run.output().count("schedules will not fire") == 1
    run.signal(signal.SIGTERM)
    assert run.wait(20) == 0, run.output()
    assert handled(tmp_path / "handled.txt") == {}
