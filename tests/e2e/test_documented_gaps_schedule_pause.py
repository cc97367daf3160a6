"""A schedule leader paused with SIGSTOP, on a real Kubernetes Lease (docs/schedules.md,
"When things happen": "when it resumes, its renew deadline has passed, so it fires
nothing until it has renewed; if another took over meanwhile, its write fails the
compare-and-set and it follows").

Three ``nsqworker run`` supervisors elect a leader on the session's kube-apiserver; the
leader's whole process group (supervisor and worker) is stopped right after it recorded
a tick in the Lease, well before the next, as a VM or a container is paused. A follower
takes the Lease over and fires what was missed; the paused leader is resumed and fenced:
the API server keeps the new holder, the resumed one says it follows and fires nothing
more; every second is handled, each by one message.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nsqworker.schedules.cron import format_tick
from nsqworker.testing import wait_for
from nsqworker.testing.holds import holds
from nsqworker.testing.kube import KubeControlPlane

from .test_schedules_run import TICK_TASKS, TIMINGS, handled, holder_pid, seconds

NAMESPACE = "default"
Start = Callable[..., Any]


def read_lease(kube: KubeControlPlane, name: str) -> tuple[str | None, dict[str, str]]:
    """The Lease's holder and its last tick fired per task, as the API server has them."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        api = client.CoordinationV1Api(kube.api_client())
        lease: Any = api.read_namespaced_lease(name, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None, {}
        raise
    annotations = lease.metadata.annotations or {}
    fired = json.loads(annotations.get("nsqworker.io/last-fired") or "{}")
    return lease.spec.holder_identity, fired


def test_a_leader_paused_with_sigstop_is_fenced_and_every_tick_fires_once(
    supervise: Start,
    write_module: Callable[[str, str], str],
    kube_control_plane: KubeControlPlane,
    nsqd: Any,
    tmp_path: Path,
) -> None:
    kube, lease = kube_control_plane, f"ticks-pause-{uuid.uuid4().hex[:6]}"
    module = write_module("pause_ticks", TICK_TASKS)
    env = {
        **TIMINGS,
        "TICK_TOPIC": "ticks_pause",
        "KUBECONFIG": str(kube.kubeconfig),
        "NSQWORKER_KUBERNETES_NAMESPACE": NAMESPACE,
        "NSQWORKER_SCHEDULE_LEADER": "kubernetes",
        "NSQWORKER_SCHEDULE_LEASE_NAME": lease,
    }
    runs = [supervise(module, "--nsqd", nsqd.tcp_address, "--workers", "1", env=env)
            for _ in range(3)]  # fmt: skip
    for run in runs:
        run.wait_ready()
    path = tmp_path / "handled.txt"
    wait_for(lambda: len(handled(path)) >= 4, 30, message=lambda: runs[0].output())

    def leader() -> Any:
        pid = holder_pid(read_lease(kube, lease)[0])
        return next((r for r in runs if r.proc.pid == pid), None)

    victim = wait_for(leader, 30, message="a leader in the Lease")
    old_holder = read_lease(kube, lease)[0]

    # Pause just after the leader recorded this second's tick in the Lease, well before
    # the next one: nothing is half published, so no tick may come twice.
    def just_recorded() -> bool:
        now = datetime.now(UTC)
        fired = read_lease(kube, lease)[1].get("tick")
        return now.microsecond < 600_000 and fired == format_tick(now)

    wait_for(just_recorded, 30, interval=0.02, message="a tick recorded early in a second")
    os.killpg(victim.proc.pid, signal.SIGSTOP)
    paused = datetime.now(UTC)
    rest = [r for r in runs if r is not victim]
    try:
        # A follower takes over within the 4 s lease and fires what was missed.
        wait_for(lambda: read_lease(kube, lease)[0] not in (None, old_holder), 30,
                 message=lambda: rest[0].output())  # fmt: skip
        new_holder = read_lease(kube, lease)[0]
        assert holder_pid(new_holder) in {r.proc.pid for r in rest}, new_holder
        caught_up = format_tick(paused + timedelta(seconds=6))
        wait_for(lambda: max(handled(path)) >= caught_up, 30, message=lambda: rest[0].output())
    finally:
        os.killpg(victim.proc.pid, signal.SIGCONT)
    resumed = datetime.now(UTC)

    # Fenced: once resumed it says it follows, the API server keeps the new holder, and
    # it fires nothing more while the ticks go on.
    wait_for(lambda: "schedules: no longer leading" in victim.output(), 30,
             message=victim.output)  # fmt: skip
    assert victim.metric("nsqworker_schedule_leader") == 0
    fired_before = victim.metric("nsqworker_schedule_ticks_fired_total")

    def still_fenced() -> bool:
        return (
            read_lease(kube, lease)[0] == new_holder
            and victim.metric("nsqworker_schedule_ticks_fired_total") == fired_before
        )

    holds(still_fenced, 3.0, "the resumed leader fired or took the Lease back", interval=0.25)
    wait_for(lambda: max(handled(path)) >= format_tick(resumed + timedelta(seconds=3)), 30,
             message=lambda: rest[0].output())  # fmt: skip
    for run in runs:
        run.signal(signal.SIGTERM)
    for run in runs:
        assert run.wait(20) == 0, run.output()

    seen = handled(path)
    missing = sorted(set(seconds(min(seen), max(seen))) - set(seen))
    assert not missing, f"ticks never handled: {missing}"
    doubled = {tick: ids for tick, ids in seen.items() if len(ids) > 1}
    assert not doubled, f"ticks published twice (paused at {format_tick(paused)}): {doubled}"
    assert min(seen) < format_tick(paused) < format_tick(resumed) < max(seen)
