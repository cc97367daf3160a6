"""``nsqworker rpc call`` against the example service (examples/rpc) run by ``nsqworker run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nsqworker.testing import NsqdProcess

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def rpc_call(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqworker", "rpc", "call", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_rpc_call_answers_from_the_example_service(
    nsqd: NsqdProcess, supervise: Callable[..., object], base_env: dict[str, str]
) -> None:
    env = {
        **base_env,
        "PYTHONPATH": os.pathsep.join([str(ROOT), base_env["PYTHONPATH"]]),
        "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address,
    }
    run = supervise("examples.rpc.service", "--workers", "1", env=env)
    run.wait_ready()  # type: ignore[attr-defined]

    done = rpc_call(env, "pricing", '{"sku": "A1", "quantity": 2}', "--timeout", "5")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "sku": "A1",
        "quantity": 2,
        "unit_price": 12.5,
        "total": 25.0,
    }

    # --nsqd instead of the environment; msgpack to a JSON-only endpoint falls back.
    no_env = {k: v for k, v in env.items() if k != "NSQWORKER_NSQD_TCP_ADDRESSES"}
    done = rpc_call(
        no_env, "stock", '{"sku": "C3"}', "--nsqd", nsqd.tcp_address, "--encoding", "msgpack",
        "--nsqd-http", nsqd.http_address,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"sku": "C3", "available": 17}

    done = rpc_call(env, "pricing", '{"sku": "Z9"}', "--timeout", "5")
    assert done.returncode == 1
    assert "pricing raised UnknownSku: unknown sku 'Z9'" in done.stderr
    assert done.stdout == ""

    done = rpc_call(env, "nobody", "{}", "--timeout", "0.3")
    assert done.returncode == 3
    assert "no response from 'nobody' within 0.3s" in done.stderr

    done = rpc_call(env, "pricing", "{not json")
    assert done.returncode == 2
    assert "REQUEST is not JSON" in done.stderr

    done = rpc_call(no_env, "pricing", "{}", "--nsqd", "127.0.0.1:1", "--timeout", "1")
    assert done.returncode == 4
    assert done.stderr.splitlines() == [
        "error: could not subscribe to the RPC reply topic on 127.0.0.1:1; is nsqd up?"
    ]
