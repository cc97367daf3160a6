"""The Spark job image (deploy/spark/Dockerfile), built the way ``make image`` builds it.

For the tests that run Spark's driver and executors as pods: ``build_spark_image(tag)``
runs ``scripts/build-image`` (podman on the local Debian python base, the proxy's CA as
the build secret) with the pyspark and py4j versions uv.lock pins, as tests/cluster's
``app_image`` fixture builds the project's image. The first build downloads pyspark
(about 455 MB) and takes minutes; a rebuild with the layers cached takes seconds.
docs/spark.md, The job image.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_IMAGE = ROOT / "scripts" / "build-image"
DOCKERFILE = ROOT / "deploy" / "spark" / "Dockerfile"
SPARK_IMAGE_REPOSITORY = "localhost/nsqworker-spark"
SPARK_IMAGE = f"{SPARK_IMAGE_REPOSITORY}:test-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]}"
"""The default tag: one per checkout, as tests/image and tests/cluster tag theirs."""
BUILD_TIMEOUT = 1800.0
"""A cold build on 2 cores downloads and unpacks pyspark: minutes, not half an hour."""


def lock_versions() -> dict[str, str]:
    """pyspark's and py4j's versions in uv.lock: what the image installs."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    wanted = {"pyspark", "py4j"}
    versions = {p["name"]: p["version"] for p in lock["package"] if p["name"] in wanted}
    missing = wanted - versions.keys()
    assert not missing, f"uv.lock pins no {', '.join(sorted(missing))}"
    return versions


def build_argv(tag: str = SPARK_IMAGE) -> list[str]:
    """The ``scripts/build-image`` command line (``make image`` runs the same)."""
    versions = lock_versions()
    return [
        str(BUILD_IMAGE),
        tag,
        "-f",
        str(DOCKERFILE),
        "--build-arg",
        f"PYSPARK_VERSION={versions['pyspark']}",
        "--build-arg",
        f"PY4J_VERSION={versions['py4j']}",
        str(DOCKERFILE.parent),
    ]


def build_spark_image(tag: str = SPARK_IMAGE) -> float:
    """Build the job image as ``tag`` in scripts/podman's store; returns the seconds taken.

    Raises AssertionError with the build's stderr when it fails.
    """
    argv = build_argv(tag)
    start = time.monotonic()
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return time.monotonic() - start
