"""HealthServer endpoints and the WorkerMetrics collector, without worker processes."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nsqworker.health import HealthServer, WorkerMetrics, task_totals

BUCKETS = [0.005, 0.01, 0.1, 1.0]


def snapshot(
    received: int = 0,
    finished: int = 0,
    *,
    task: str = "svc.archive",
    topic: str = "clicks",
    channel: str = "archive",
    requeued: int = 0,
    dead_lettered: int = 0,
    in_flight: int = 0,
    rdy: int = 0,
    connections: int = 1,
    backoff_level: int = 0,
    subscribed: bool = True,
    counts: list[int] | None = None,
    duration_sum: float = 0.0,
) -> dict[str, Any]:
    """A ``WorkerStats.as_dict()``-shaped snapshot with one task."""
    return {
        "ready": subscribed,
        "tasks": {
            task: {
                "name": task,
                "topic": topic,
                "channel": channel,
                "received": received,
                "finished": finished,
                "requeued": requeued,
                "dead_lettered": dead_lettered,
                "in_flight": in_flight,
                "rdy": rdy,
                "connections": connections,
                "backoff_level": backoff_level,
                "subscribed": subscribed,
                "duration": {
                    "buckets": BUCKETS,
                    "counts": counts or [0] * (len(BUCKETS) + 1),
                    "sum": duration_sum,
                },
            }
        },
    }


def scrape(metrics: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the collector as {(name, sorted labels): value}."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The one sample called ``name`` whose labels include ``labels``."""
    found = [
        v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


# ---------------------------------------------------------------------------- collector


def test_task_stats_reads_a_snapshot() -> None:
    (stats,) = task_totals(snapshot(3, 2, requeued=1, in_flight=1, counts=[1, 0, 1, 0, 1]))
    assert (stats.task, stats.topic, stats.channel) == ("svc.archive", "clicks", "archive")
    assert stats.counters == {
        "received": 3, "finished": 2, "requeued": 1, "dead_lettered": 0, "backoff_stalls": 0
    }  # fmt: skip
    assert stats.gauges["in_flight"] == 1
    assert stats.buckets == {0.005: 1, 0.01: 0, 0.1: 1, 1.0: 0, math.inf: 1}


def test_task_stats_tolerates_missing_numbers() -> None:
    (stats,) = task_totals({"tasks": {"t": {"topic": "a", "channel": "b"}}})
    assert stats.task == "t"
    assert stats.counters["received"] == 0
    assert task_totals({}) == []


def test_counters_sum_over_children_and_survive_a_retired_child() -> None:
    metrics = WorkerMetrics()
    metrics.update(1, snapshot(10, 9, in_flight=1, rdy=5, backoff_level=1))
    metrics.update(2, snapshot(5, 5, in_flight=2, rdy=5, backoff_level=3))
    samples = scrape(metrics)
    assert value(samples, "nsqworker_messages_received_total", task="svc.archive") == 15
    assert value(samples, "nsqworker_messages_finished_total", topic="clicks") == 14
    assert value(samples, "nsqworker_messages_in_flight", channel="archive") == 3
    assert value(samples, "nsqworker_rdy") == 10
    assert value(samples, "nsqworker_backoff_level") == 3  # the worst child, not a sum

    metrics.retire(1)  # child 1 died; its replacement starts from zero
    metrics.update(3, snapshot(1, 1))
    samples = scrape(metrics)
    assert value(samples, "nsqworker_messages_received_total") == 16  # never goes down
    assert value(samples, "nsqworker_messages_finished_total") == 15
    assert value(samples, "nsqworker_messages_in_flight") == 2  # gauges: live children only
    assert value(samples, "nsqworker_backoff_level") == 3


def test_otel_named_metrics_carry_messaging_labels() -> None:
    metrics = WorkerMetrics()
    metrics.update(1, snapshot(4, 4, counts=[1, 1, 1, 1, 0], duration_sum=0.5))
    samples = scrape(metrics)
    labels = {
        "task": "svc.archive",
        "messaging_system": "nsq",
        "messaging_operation_name": "process",
        "messaging_destination_name": "clicks",
        "messaging_consumer_group_name": "archive",
    }
    assert value(samples, "messaging_client_consumed_messages_total", **labels) == 4
    assert value(samples, "messaging_process_duration_seconds_count", **labels) == 4
    assert value(samples, "messaging_process_duration_seconds_sum", **labels) == 0.5
    assert value(samples, "messaging_process_duration_seconds_bucket", le="0.01") == 2
    assert value(samples, "messaging_process_duration_seconds_bucket", le="1.0") == 4
    assert value(samples, "messaging_process_duration_seconds_bucket", le="+Inf") == 4


def test_histograms_merge_across_children_and_retirement() -> None:
    metrics = WorkerMetrics()
    metrics.update(1, snapshot(2, 2, counts=[1, 0, 0, 0, 1], duration_sum=3.0))
    metrics.update(2, snapshot(1, 1, counts=[0, 1, 0, 0, 0], duration_sum=0.01))
    metrics.retire(2)
    samples = scrape(metrics)
    assert value(samples, "messaging_process_duration_seconds_count") == 3
    assert value(samples, "messaging_process_duration_seconds_bucket", le="0.005") == 1
    assert value(samples, "messaging_process_duration_seconds_bucket", le="0.01") == 2
    assert value(samples, "messaging_process_duration_seconds_sum") == pytest.approx(3.01)


def test_supervisor_gauges() -> None:
    metrics = WorkerMetrics()
    metrics.alive, metrics.restarts = 2, 3
    samples = scrape(metrics)
    assert value(samples, "nsqworker_workers_alive") == 2
    assert value(samples, "nsqworker_worker_restarts_total") == 3


def test_tasks_are_kept_apart() -> None:
    metrics = WorkerMetrics()
    metrics.update(1, snapshot(1, task="a", topic="t1", channel="c"))
    metrics.update(2, snapshot(2, task="b", topic="t2", channel="c"))
    samples = scrape(metrics)
    assert value(samples, "nsqworker_messages_received_total", task="a", topic="t1") == 1
    assert value(samples, "nsqworker_messages_received_total", task="b", topic="t2") == 2


# ---------------------------------------------------------------------------- server


class Probe:
    """Answers of the health callbacks, changed by the tests."""

    def __init__(self) -> None:
        self.live = True
        self.ready = False
        self.details: dict[str, Any] = {"workers": [{"worker": 1, "waiting_for": ["a"]}]}

    def is_live(self) -> bool:
        return self.live

    def is_ready(self) -> tuple[bool, dict[str, Any]]:
        return self.ready, self.details


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, Probe, WorkerMetrics]]:
    probe, metrics = Probe(), WorkerMetrics()
    server = HealthServer("127.0.0.1", 0, probe.is_live, probe.is_ready, metrics)
    with server:
        yield server, probe, metrics


def get(server: HealthServer, path: str) -> tuple[int, str, str]:
    """``(status, content type, body)`` of GET ``path``; error statuses included."""
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_livez_follows_is_live(served: tuple[HealthServer, Probe, WorkerMetrics]) -> None:
    server, probe, _ = served
    assert get(server, "/livez")[0] == 200
    assert get(server, "/healthz")[0] == 200
    probe.live = False
    status, kind, body = get(server, "/livez")
    assert (status, kind, json.loads(body)) == (503, "application/json", {"live": False})


def test_readyz_says_what_is_not_ready(served: tuple[HealthServer, Probe, WorkerMetrics]) -> None:
    server, probe, _ = served
    status, _, body = get(server, "/readyz")
    assert status == 503
    assert json.loads(body) == {"ready": False, "workers": [{"worker": 1, "waiting_for": ["a"]}]}
    probe.ready, probe.details = True, {"workers": [{"worker": 1, "ready": True}]}
    status, _, body = get(server, "/readyz/")
    assert status == 200 and json.loads(body)["ready"] is True


def test_metrics_in_prometheus_text(served: tuple[HealthServer, Probe, WorkerMetrics]) -> None:
    server, _, metrics = served
    metrics.update(1, snapshot(7, 6))
    status, kind, body = get(server, "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    assert (
        'nsqworker_messages_received_total{channel="archive",task="svc.archive",topic="clicks"} 7.0'
        in body
    )
    assert "# TYPE messaging_process_duration_seconds histogram" in body


def test_unknown_paths_and_methods(served: tuple[HealthServer, Probe, WorkerMetrics]) -> None:
    server, _, _ = served
    assert get(server, "/nope")[0] == 404
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/livez", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=5)
    assert info.value.code == 405


def test_a_taken_port_fails_at_start() -> None:
    probe, metrics = Probe(), WorkerMetrics()
    with HealthServer("127.0.0.1", 0, probe.is_live, probe.is_ready, metrics) as first:
        second = HealthServer("127.0.0.1", first.port, probe.is_live, probe.is_ready, metrics)
        with pytest.raises(OSError):
            second.start()


def test_stop_releases_the_port() -> None:
    probe, metrics = Probe(), WorkerMetrics()
    server = HealthServer("127.0.0.1", 0, probe.is_live, probe.is_ready, metrics)
    server.start()
    port = server.port
    server.stop()
    server.stop()  # twice is fine
    again = HealthServer("127.0.0.1", port, probe.is_live, probe.is_ready, metrics)
    again.start()
    again.stop()
