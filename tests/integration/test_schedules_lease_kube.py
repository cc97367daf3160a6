"""A follower waits the lease duration its holder wrote in the Lease, not its own
(nsqworker/schedules/lease.py; client-go reads ``leaseDurationSeconds`` the same way),
on a real kube-apiserver (the session's ``kube_control_plane``) and the real clock."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from nsqworker.schedules.kube import KubeLeaseStore
from nsqworker.schedules.lease import Elector, Timings
from nsqworker.testing.kube import KubeControlPlane

pytestmark = pytest.mark.integration

HOLDER = Timings(lease_duration=6.0, renew_deadline=4.0, retry_period=1.0)
FOLLOWER = Timings(lease_duration=2.0, renew_deadline=1.0, retry_period=0.25)


def lease_spec(kube: KubeControlPlane, name: str) -> Any:
    """The Lease's spec, as the API server has it."""
    from kubernetes import client

    return client.CoordinationV1Api(kube.api_client()).read_namespaced_lease(name, "default").spec


async def test_a_follower_with_a_shorter_lease_waits_the_holders(
    kube_control_plane: KubeControlPlane,
) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    stores = [KubeLeaseStore(kube_control_plane.api_client(), "default", name, 5.0) for _ in "ab"]
    holder = Elector(stores[0], "holder", HOLDER)
    follower = Elector(stores[1], "follower", FOLLOWER)
    try:
        assert await holder.try_lead()  # writes the Lease once, then stops renewing
        spec = await asyncio.to_thread(lease_spec, kube_control_plane, name)
        assert (spec.holder_identity, spec.lease_duration_seconds) == ("holder", 6)
        # The follower tries every retry_period until it leads; it must wait the 6 s
        # the holder wrote, counted from its first read, not its own 2 s.
        first_read = time.monotonic()
        deadline = first_read + 15
        while not await follower.try_lead():
            assert time.monotonic() < deadline, "the follower never took the lease over"
            await asyncio.sleep(FOLLOWER.retry_period)
        waited = time.monotonic() - first_read
        assert waited >= HOLDER.lease_duration, f"taken over after {waited:.1f} s"
        assert waited < HOLDER.lease_duration + 2, f"taken over only after {waited:.1f} s"
        spec = await asyncio.to_thread(lease_spec, kube_control_plane, name)
        assert (spec.holder_identity, spec.lease_duration_seconds) == ("follower", 2)
        assert spec.lease_transitions == 1
    finally:
        for store in stores:
            await store.close()
