"""``nsqworker_connection_errors_total``: summed over processes, kept when one dies."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from nsqworker.health import WorkerMetrics


def snapshot(**errors: int) -> dict[str, object]:
    task = {"name": "t", "topic": "clicks", "channel": "c", "connection_errors": errors}
    return {"ready": True, "tasks": {"t": task}}


def scrape(metrics: WorkerMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()


def test_connection_errors_by_reason_survive_a_dead_process() -> None:
    metrics = WorkerMetrics()
    metrics.update(1, snapshot(heartbeat=2, fin_failed=1))
    metrics.update(2, snapshot(heartbeat=1))
    metrics.retire(1)
    text = scrape(metrics)
    name = "nsqworker_connection_errors_total"
    assert f'{name}{{channel="c",reason="heartbeat",task="t",topic="clicks"}} 3.0' in text
    assert f'{name}{{channel="c",reason="fin_failed",task="t",topic="clicks"}} 1.0' in text


def test_an_old_snapshot_without_errors_is_read() -> None:
    metrics = WorkerMetrics()
    metrics.update(1, {"ready": True, "tasks": {"t": {"name": "t"}}})
    assert "nsqworker_connection_errors" in scrape(metrics)
