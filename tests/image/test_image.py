"""The root Dockerfile's image and a service image FROM it, built and run with podman."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from nsqworker.testing import NsqdProcess, free_port, wait_for

if TYPE_CHECKING:
    from tests.image.conftest import Built, Podman

pytestmark = pytest.mark.timeout(600)  # the first test builds the images (uv downloads cold)

ROOT = Path(__file__).resolve().parents[2]

# What the image adds to its Python base (the virtualenv: nsqworker, its dependencies and
# the uvloop, kubernetes and console extras, bytecode compiled; 204 MB when this was set
# (the console extra added about 4 MB since), 126 MB
# of it the kubernetes client), and the whole image on the local Debian base (Debian's
# python3 and pip; the official python:3.12-slim-bookworm is smaller).
ADDED_BUDGET = 240e6
TOTAL_BUDGET = 480e6

QUICKSTART_SYNC = ("quickstart_sync", "counter")  # count_words: 0.2 s each, 4 at a time
DONE = "counted in a thread"  # what count_words logs when it returns


def worker_env(nsqd: NsqdProcess, health_port: int) -> list[str]:
    """``-e`` options: nsqd on the host's loopback, health on loopback, a 10 s drain."""
    env = {
        "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address,
        "NSQWORKER_HEALTH_PORT": str(health_port),
        # the image binds 0.0.0.0 (reached from outside its network namespace); a test
        # on the host's network stays on loopback
        "NSQWORKER_HEALTH_HOST": "127.0.0.1",
        "NSQWORKER_DRAIN_TIMEOUT": "10",
        "NSQWORKER_LOG_FORMAT": "json",
    }
    return [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]


def finished_metric(port: int) -> float:
    """count_words' nsqworker_messages_finished_total on /metrics (0 until it shows)."""
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
    found = re.search(
        r'^nsqworker_messages_finished_total\{[^}]*task="[\w.]*count_words"[^}]*\} (\S+)$',
        metrics,
        re.M,
    )
    return float(found[1]) if found else 0.0


def stop(podman: Podman, container: str, grace: int) -> tuple[int, float]:
    """``podman stop`` (SIGTERM to PID 1, SIGKILL after ``grace``): exit code and seconds."""
    start = time.monotonic()
    podman.run("stop", "--time", str(grace), container, timeout=grace + 30)
    elapsed = time.monotonic() - start
    return int(podman.inspect(container)["State"]["ExitCode"]), elapsed


def test_the_image_is_within_its_size_budget(podman: Podman, image: Built) -> None:
    added = image.size - podman.size(podman.base_image)
    print(f"{image.tag}: {image.size / 1e6:.0f} MB, {added / 1e6:.0f} MB over {podman.base_image}")
    assert added <= ADDED_BUDGET, f"the image adds {added / 1e6:.0f} MB to its base"
    assert image.size <= TOTAL_BUDGET, f"the image is {image.size / 1e6:.0f} MB"


def test_it_runs_as_10001_on_a_read_only_root_filesystem(podman: Podman, image: Built) -> None:
    config = podman.inspect(image.tag)["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["nsqworker"]
    assert "NSQWORKER_HEALTH_HOST=0.0.0.0" in config["Env"]
    probe = (
        "import os, sys\n"
        "print(os.getuid(), os.getgid(), sys.prefix)\n"
        "try:\n"
        "    open('/opt/nsqworker/written', 'w')\n"
        "except OSError as exc:\n"
        "    print(exc.strerror)\n"
    )
    out = podman.run(
        "run", "--rm", "--read-only", "--entrypoint", "python", image.tag, "-c", probe
    ).stdout.splitlines()
    assert out == ["10001 10001 /opt/nsqworker", "Read-only file system"]
    version = podman.run("run", "--rm", "--read-only", image.tag, "--version").stdout
    assert version.startswith("nsqworker "), version


def test_quickstart_consumes_and_stop_drains_without_loss(
    podman: Podman, image: Built, nsqd: NsqdProcess
) -> None:
    topic, channel = QUICKSTART_SYNC
    total = 60
    nsqd.create_channel(topic, channel)
    port = free_port()
    options = [
        "--read-only",
        "--volume",
        f"{ROOT / 'examples'}:/app/examples:ro",
        *worker_env(nsqd, port),
    ]
    with podman.container(
        image.tag, "run", "examples.quickstart.tasks", options=options
    ) as container:
        podman.wait_ready(container, port)
        assert httpx.get(f"http://127.0.0.1:{port}/livez", trust_env=False).status_code == 200
        # PID 1 is the supervisor itself: SIGTERM reaches it with nothing in between
        cmdline = podman.run("exec", container, "cat", "/proc/1/cmdline").stdout
        assert cmdline.split("\0")[:3] == [
            "/opt/nsqworker/bin/python",
            "/opt/nsqworker/bin/nsqworker",
            "run",
        ], cmdline

        # a first batch, all handled: /metrics counts it
        first = 8
        nsqd.mpublish(topic, [f'{{"text": "warm-up {i}"}}' for i in range(first)])
        wait_for(
            lambda: finished_metric(port) == first,
            timeout=30,
            message=lambda: f"/metrics does not count {first} FINs:\n{podman.logs(container)}",
        )
        # a second batch, stopped while it is being handled
        nsqd.mpublish(topic, [f'{{"text": "message {i}"}}' for i in range(total - first)])
        wait_for(
            lambda: podman.logs(container).count(DONE) >= first + 4,
            timeout=30,
            message=lambda: f"the second batch is not consumed:\n{podman.logs(container)}",
        )
        code, seconds = stop(podman, container, grace=15)
        logs = podman.logs(container)
        assert code == 0, logs
        assert seconds < 15, f"podman stop took {seconds:.1f}s: the drain did not end in time"

    stats = nsqd.channel_stats(topic, channel)
    assert stats is not None
    texts = re.findall(r"word\(s\) in '([^']+)', counted in a thread", logs)
    handled = len(texts)
    assert handled == logs.count(DONE)
    # every message that left the channel had its handler run to the end, once (a drain
    # REQs what it cannot finish, back into the channel); none is in flight
    assert len(set(texts)) == handled, "a message was handled twice"
    assert (stats["in_flight_count"], stats["deferred_count"]) == (0, 0), stats
    assert handled + stats["depth"] == total, (handled, stats)
    assert stats["depth"] > 0, "every message was done before the stop: the drain went untested"
    print(f"drained in {seconds:.1f}s: {handled} finished, {stats['depth']} left in the channel")


def test_a_service_image_from_it_runs_its_task(
    podman: Podman, service_image: Built, nsqd: NsqdProcess
) -> None:
    nsqd.create_channel("clicks", "archive")
    port = free_port()
    # no arguments: the service image's CMD ["run", "myservice.tasks"]
    with podman.container(
        service_image.tag, options=["--read-only", *worker_env(nsqd, port)]
    ) as container:
        podman.wait_ready(container, port)
        nsqd.publish("clicks", b'{"page": "/pricing"}')
        wait_for(
            lambda: '"body": "{\\"page\\": \\"/pricing\\"}"' in podman.logs(container),
            timeout=30,
            message=lambda: f"the click was not logged:\n{podman.logs(container)}",
        )
        code, _ = stop(podman, container, grace=15)
        assert code == 0, podman.logs(container)
    stats = nsqd.channel_stats("clicks", "archive")
    assert stats is not None
    assert (stats["message_count"], stats["depth"], stats["in_flight_count"]) == (1, 0, 0)
    assert stats["requeue_count"] == 0
