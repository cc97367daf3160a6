"""A team new to nsqworker, on each broker, from zero, outside this repository (issue 39).

What docs/getting-started.md, docs/nats.md, docs/rabbitmq-streams.md and docs/testing.md
tell a user to do, done in a project directory of its own with the built wheel in a fresh
venv (built and installed as tests/e2e/test_wheel.py does, offline): `nsqworker dev broker`,
the page's tasks module run as a service (`nsqworker run`) and published to, the page's
handler test run by pytest with the real broker's fixture (under CI=true: a skip fails),
and the chart rendered with the page's values.

The broker binaries are found as the docs say, through NSQWORKER_TOOLS_BIN, which stays
set in the shell that runs the worker, as it would in a user's. One venv serves the
three transports.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from nsqworker.testing import find_binary, free_port, wait_for
from tests.e2e.dev_broker import DevBroker, exported
from tests.e2e.test_wheel import _run, _uv

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHART = ROOT / "deploy" / "helm" / "nsqworker"
TOOLS_BIN = ROOT / ".tools" / "bin"
pytestmark = pytest.mark.e2e

#: Per transport: the page a team follows, the topic of its tasks module, and what its
#: handler prints for the message {"id": 1}.
PAGES = {
    "nsq": ("getting-started.md", "clicks", "archived click 1"),
    "nats": ("nats.md", "orders.created", "billing order 1 attempt 1"),
    "rabbitmq-stream": ("rabbitmq-streams.md", "payments", "booking 1 attempt 1"),
}
BROKER_START = {"nsq": 30.0, "nats": 30.0, "rabbitmq-stream": 120.0}
FILE_HEADER = re.compile(r"^# ([\w./-]+\.py)\s*$")


def doc_files(page: str) -> dict[str, str]:
    """Every ```python block of ``page`` that starts with a file name comment, by file name
    (a block may hold several files, each from its own comment on)."""
    files: dict[str, str] = {}
    for block in re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(), re.M | re.S):
        name = None
        for line in block.splitlines(keepends=True):
            header = FILE_HEADER.match(line)
            if header:
                name = header.group(1)
                files[name] = ""
            if name is not None:
                files[name] += line
    return files


def doc_yaml(page: str, first_key: str) -> dict[str, object]:
    """The first ```yaml block of ``page`` whose first line starts with ``first_key``."""
    for block in re.findall(r"^```yaml\n(.*?)^```", (DOCS / page).read_text(), re.M | re.S):
        if block.startswith(first_key):
            values: dict[str, object] = yaml.safe_load(block)
            return values
    raise AssertionError(f"no yaml block starting with {first_key!r} in {page}")


@dataclass
class Project:
    """A user's project: its directory, its venv's bin and the shell environment."""

    root: Path
    bin: Path
    env: dict[str, str]

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
        done = subprocess.run(
            list(args), cwd=self.root, env=env or self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The wheel in a fresh venv (the project's dependencies visible through a .pth, the
    editable nsqworker not), and an empty project directory outside this checkout."""
    if not (TOOLS_BIN / "nsqd").exists():
        pytest.fail("the broker binaries are missing: run `make tools`")
    dist = tmp_path_factory.mktemp("dist")
    build_env = {**os.environ, "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never"}
    build_env.pop("VIRTUAL_ENV", None)
    build = [_uv(), "build", "--wheel", "--no-build-isolation", "--out-dir", dist]
    _run([*build, "--python", sys.executable], cwd=ROOT, env=build_env)
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv)
    python = venv / "bin" / "python"
    _run([_uv(), "pip", "install", "--no-deps", "--python", python, wheel], cwd=venv, env=build_env)
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], venv)
    Path(purelib.strip(), "zz_project_dependencies.pth").write_text(
        sysconfig.get_path("purelib") + "\n"
    )
    root = tmp_path_factory.mktemp("myservice")
    assert ROOT not in root.parents
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NSQWORKER_", "VIRTUAL_ENV", "PYTHON", "RABBITMQ_STREAM"))}  # fmt: skip
    env.update(
        PATH=os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        HOME=str(root / "home"),  # no ~/.local/share/nsqworker: the variable finds them
        XDG_DATA_HOME=str(root / "home" / "data"),
        NSQWORKER_TOOLS_BIN=str(TOOLS_BIN),  # as README and testing.md say, kept set
        CI="true",  # a fixture that cannot find its broker fails instead of skipping
        COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    return Project(root, venv / "bin", env)


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return int(response.status)
    except OSError:
        return 0


@contextlib.contextmanager
def service(project: Project, env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    log = (project.root / "service.log").open("w")
    proc = subprocess.Popen(
        [str(project.bin / "nsqworker"), "run", "myservice.tasks", *args],
        cwd=project.root, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def service_output(project: Project) -> str:
    return (project.root / "service.log").read_text(errors="replace")


@pytest.mark.parametrize("transport", list(PAGES))
def test_a_team_follows_its_broker_page_from_zero(project: Project, transport: str) -> None:
    page, topic, handled = PAGES[transport]
    for leftover in ("myservice", "test_tasks.py", "test_billing.py", "conftest.py", ".env"):
        path = project.root / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    # 1. the page's tasks module, in the project
    tasks = doc_files(page)["myservice/tasks.py"]
    (project.root / "myservice").mkdir()
    (project.root / "myservice" / "__init__.py").write_text("")
    (project.root / "myservice" / "tasks.py").write_text(tasks)

    # 2. a broker in one step: the address, and the export line to use
    broker = DevBroker(
        [str(project.bin / "nsqworker"), "dev", "broker", "--transport", transport,
         "--free-ports", "--env-file", ".env"], project.root, project.env,
    )  # fmt: skip
    try:
        printed = broker.read_until("Ctrl-C stops it.", BROKER_START[transport])
        env_vars = exported(printed)
        assert env_vars["NSQWORKER_TRANSPORT"] == transport, printed
        assert (project.root / ".env").read_text().startswith(f"NSQWORKER_TRANSPORT={transport}\n")
        shell = {**project.env, **env_vars}  # NSQWORKER_TOOLS_BIN is still set

        # 3. the service, published to; one message it fails on (the retry line)
        health = free_port()
        workers = "2" if transport == "rabbitmq-stream" else "1"  # one active, one standby
        with service(project, shell, "--workers", workers, "--health-port", str(health),
                     "--log-format", "json") as proc:  # fmt: skip
            wait_for(lambda: readyz(health) == 200 or proc.poll() is not None, 60,
                     message=lambda: f"never ready:\n{service_output(project)}")  # fmt: skip
            assert proc.poll() is None, service_output(project)
            project.run(str(project.bin / "nsqworker"), "publish", topic, '{"id": 1}', env=shell)
            project.run(str(project.bin / "nsqworker"), "publish", topic, '{"no": "id"}', env=shell)
            events = lambda: [  # noqa: E731
                json.loads(line) for line in service_output(project).splitlines()
                if line.startswith("{")
            ]  # fmt: skip
            wait_for(lambda: any(e.get("event") == "retry" for e in events()), 60,
                     message=lambda: f"no retry line:\n{service_output(project)}")  # fmt: skip
            wait_for(lambda: handled in service_output(project), 30,
                     message=lambda: service_output(project))  # fmt: skip
            assert not [e for e in events() if e.get("event") in {"req", "fin"}]
            if transport == "rabbitmq-stream":
                wait_for(lambda: "standing by for ledger on payments" in service_output(project),
                         30, message=lambda: service_output(project))  # fmt: skip
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, service_output(project)

        # 4. the handler test, with the real broker's fixture
        write_handler_test(project, transport)
        test_env = dict(project.env)
        if transport == "rabbitmq-stream":  # testing.md: a RabbitMQ you run
            test_env["RABBITMQ_STREAM_TEST_URI"] = env_vars["NSQWORKER_RABBITMQ_STREAM_URI"]
        result = project.run(
            str(project.bin / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
            env=test_env, timeout=180,
        )  # fmt: skip
        assert re.search(r"\b1 passed\b", result) and "skipped" not in result, result
    finally:
        if broker.proc.poll() is None:
            code, said = broker.stop()
            broker.kill()
        else:
            code, said = broker.proc.returncode, broker.err
    assert code == 0 and said.rstrip().endswith("stopped"), said
    port = int(env_vars[next(k for k in env_vars if k != "NSQWORKER_TRANSPORT")]
               .rsplit(":", 1)[1].split("/")[0].split(",")[0])  # fmt: skip
    assert not _listening(port), f"port {port} still open after Ctrl-C"

    # 5. the chart with the page's values
    render_chart(transport)


def write_handler_test(project: Project, transport: str) -> None:
    """getting-started's conftest.py and test_tasks.py on NSQ; testing.md's test_billing.py
    on NATS, and on RabbitMQ with the two changes testing.md gives."""
    if transport == "nsq":
        files = doc_files("getting-started.md")
        (project.root / "conftest.py").write_text(files["conftest.py"])
        (project.root / "test_tasks.py").write_text(files["test_tasks.py"])
        return
    source = doc_files("testing.md")["test_billing.py"]
    (project.root / "conftest.py").write_text(doc_files("testing.md")["conftest.py"])
    if transport == "rabbitmq-stream":
        old = 'Settings(transport="nats", nats_servers=[nats_server.url])'
        assert "(nats_server)" in source and old in source
        source = source.replace("(nats_server)", "(rabbitmq)").replace(
            old, 'Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=rabbitmq)'
        )
    (project.root / "test_billing.py").write_text(source)


def render_chart(transport: str) -> None:
    helm = find_binary("helm", TOOLS_BIN)
    if transport == "nsq":
        values: dict[str, object] = {"tasks": "myservice.tasks"}
    elif transport == "nats":
        values = doc_yaml("nats.md", "transport: nats")
    else:
        values = doc_yaml("kubernetes.md", "transport: rabbitmq-stream")
    out = subprocess.run(
        [helm, "template", "myservice", str(CHART), "-f", "-"], input=yaml.safe_dump(values),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    configmap = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ConfigMap")
    assert configmap["data"]["NSQWORKER_TRANSPORT"] == transport
    if transport == "nats":
        assert "nats-jetstream" in out.stdout and "nsq trigger" not in out.stdout


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_help_names_every_broker_and_the_dev_command(project: Project) -> None:
    shown = project.run(str(project.bin / "nsqworker"), "--help")
    assert "NSQ topics" not in shown
    assert "NSQ, NATS JetStream or RabbitMQ Streams" in shown and "dev" in shown
    assert "REQing" not in project.run(str(project.bin / "nsqworker"), "run", "--help")
    missing = subprocess.run(
        [str(project.bin / "nsqworker"), "dev", "broker", "--transport", "nats"],
        cwd=project.root, env={**project.env, "NSQWORKER_TOOLS_BIN": str(project.root / "none")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "go install github.com/nats-io/nats-server/v2@v2.15.2" in missing.stderr
