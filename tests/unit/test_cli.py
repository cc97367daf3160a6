"""The ``nsqworker`` command through typer's CliRunner: tasks, settings, version, errors."""

from __future__ import annotations

import itertools
import json
import re
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from nsqworker import __version__
from nsqworker.cli import app

# Wide enough that rich never folds a cell, so rows can be read back from the text.
ENV = {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
_names = itertools.count()

TASKS = """
from nsqworker.task import Registry, Reject

registry = Registry()

def alert(msg, reason):
    pass

@registry.task("clicks", channel="archive", max_in_flight=7)
async def archive(msg):
    pass

@registry.task(
    "reports", channel="spark", max_attempts=3, retry_delay=2.5,
    on_dead_letter=alert, dead_letter_topic="reports.dead",
)
def build_report(msg):
    raise Reject("no")
"""


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env=ENV)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module holding TASKS; returns its name."""
    name = f"cli_tasks_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TASKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for key in ("NSQWORKER_CONFIG", "NSQWORKER_MAX_IN_FLIGHT", "NSQWORKER_AUTH_SECRET"):
        monkeypatch.delenv(key, raising=False)
    return name


def row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row that starts with ``first_cell``.

    Works for both tables: ``tasks`` (cells apart by blanks) and ``settings`` (boxed).
    """
    for line in output.splitlines():
        cells = [c for c in re.split(r"\s{2,}|\s*│\s*", line.strip(" │")) if c]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{output}")


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"nsqworker {__version__} ")


def test_no_arguments_shows_help(runner: CliRunner) -> None:
    result = runner.invoke(app, [])
    assert "run" in result.output and "publish" in result.output


def test_tasks_table_shows_resolved_values(runner: CliRunner, module: str) -> None:
    result = runner.invoke(
        app, ["tasks", f"{module}:registry"], env={"NSQWORKER_MAX_ATTEMPTS": "9"}
    )
    assert result.exit_code == 0, result.output
    assert "2 tasks" in result.stdout
    # max_attempts and requeue from settings
    archive = row(result.stdout, f"{module}.archive")  # in full, as logs and metrics say
    assert archive[1:] == ["clicks", "archive", "7", "9", "5s", "-", "-", "-", "async"]
    report = row(result.stdout, f"{module}.build_report")
    assert report[1:] == ["reports", "spark", "100", "3", "2.5s", "alert()", "-", "-", "sync"]
    timed = runner.invoke(
        app, ["tasks", f"{module}:registry"], env={"NSQWORKER_TASK_TIMEOUT": "30"}
    )
    assert row(timed.stdout, f"{module}.archive")[-2] == "30s, retry"  # the settings, dimmed
    assert row(result.stdout, "→ reports.dead")


def test_tasks_table_shows_the_timeout_action(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "timed_tasks.py").write_text(
        textwrap.dedent("""
        from nsqworker.task import Registry
        registry = Registry()

        @registry.task("a", channel="c", timeout=2, timeout_action="abandon")
        def own(msg):
            pass

        @registry.task("b", channel="c", timeout=3)
        def inherited(msg):
            pass
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {"NSQWORKER_TIMEOUT_ACTION": "dead_letter"}
    result = runner.invoke(app, ["tasks", "timed_tasks:registry"], env=env)
    assert result.exit_code == 0, result.output
    assert row(result.stdout, "timed_tasks.own")[-2] == "2s, abandon"
    assert row(result.stdout, "timed_tasks.inherited")[-2] == "3s, dead_letter"
    as_json = runner.invoke(app, ["tasks", "timed_tasks:registry", "--json"], env=env)
    own, inherited = json.loads(as_json.stdout)
    assert (own["timeout_action"], "timeout_action" in own["defaults"]) == ("abandon", False)
    assert (inherited["timeout_action"], "timeout_action" in inherited["defaults"]) == (
        "dead_letter", True,
    )  # fmt: skip


def test_tasks_json(runner: CliRunner, module: str) -> None:
    result = runner.invoke(app, ["tasks", f"{module}:registry", "--json"])
    assert result.exit_code == 0, result.output
    archive, report = json.loads(result.stdout)
    assert archive == {
        "name": f"{module}.archive",
        "topic": "clicks",
        "channel": "archive",
        "max_in_flight": 7,
        "max_attempts": 5,
        "retry_delay": 5.0,
        "on_dead_letter": None,
        "dead_letter_topic": None,
        "kind": "async",
        "body": None,
        "timeout": None,
        "timeout_action": "retry",
        "transport": "nsq",
        "publish_to": None,
        "defaults": ["max_attempts", "retry_delay", "timeout", "timeout_action"],
    }
    assert report["on_dead_letter"] == f"{module}.alert"
    assert report["defaults"] == ["max_in_flight", "timeout", "timeout_action"]


TYPED = """
from nsqworker import Message
from nsqworker.task import Registry
from pydantic import BaseModel

registry = Registry()

class Click(BaseModel):
    id: int

@registry.task("clicks", channel="model")
async def model(click: Click) -> None:
    pass

@registry.task("clicks", channel="generic")
def generic(msg: Message, ids: list[int]) -> None:
    pass

@registry.task("clicks", channel="nested")
async def nested(batch: dict[str, list[Click]] | None) -> None:
    pass
"""


def test_tasks_show_a_typed_body_by_its_full_type(
    runner: CliRunner, tmp_path: Path, module: str
) -> None:
    (tmp_path / f"{module}_typed.py").write_text(TYPED)
    table = runner.invoke(app, ["tasks", f"{module}_typed:registry"])
    assert table.exit_code == 0, table.output
    assert row(table.stdout, f"{module}_typed.model")[-1] == "async, Click"
    assert row(table.stdout, f"{module}_typed.generic")[-1] == "sync, list[int]"
    as_json = runner.invoke(app, ["tasks", f"{module}_typed:registry", "--json"])
    bodies = {task["name"].rpartition(".")[2]: task["body"] for task in json.loads(as_json.stdout)}
    assert bodies == {
        "model": "Click",
        "generic": "list[int]",
        "nested": "dict[str, list[Click]] | None",
    }


def test_tasks_import_error_exits_2(runner: CliRunner, tmp_path: Path, module: str) -> None:
    (tmp_path / "cli_broken.py").write_text("import os\n\nx = 1 / 0\n")
    result = runner.invoke(app, ["tasks", "cli_broken"])
    assert result.exit_code == 2
    assert "could not import cli_broken: ZeroDivisionError: division by zero" in result.stderr
    assert 'cli_broken.py", line 3' in result.stderr
    assert "importlib" not in result.stderr and "nsqworker" not in result.stderr


def test_tasks_missing_module_exits_2(runner: CliRunner, module: str) -> None:
    result = runner.invoke(app, ["tasks", "no_such_module_here"])
    assert result.exit_code == 2
    assert "no module named 'no_such_module_here'" in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_masks_secrets_and_names_sources(runner: CliRunner, module: str) -> None:
    env = {"NSQWORKER_AUTH_SECRET": "hunter2", "NSQWORKER_MAX_IN_FLIGHT": "42"}
    result = runner.invoke(app, ["settings"], env=env)
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    assert row(result.stdout, "auth_secret")[1:3] == ["********", "env"]
    assert row(result.stdout, "max_in_flight")[1:3] == ["42", "env"]
    assert row(result.stdout, "max_attempts")[1:3] == ["5", "default"]


def test_settings_json_and_config_file(runner: CliRunner, tmp_path: Path, module: str) -> None:
    config = tmp_path / "nsqworker.toml"
    config.write_text('drain_timeout = 12.5\nauth_secret = "s3cret"\n')
    result = runner.invoke(app, ["settings", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["drain_timeout"] == {"value": 12.5, "source": "file"}
    assert data["auth_secret"]["value"] == "********"
    assert data["workers"] == {"value": 1, "source": "default"}
    assert "s3cret" not in result.stdout


def test_bad_setting_names_its_field_and_exits_2(runner: CliRunner, module: str) -> None:
    result = runner.invoke(app, ["settings"], env={"NSQWORKER_MAX_IN_FLIGHT": "0"})
    assert result.exit_code == 2
    assert "NSQWORKER_MAX_IN_FLIGHT (max_in_flight)" in result.stderr
    assert "Traceback" not in result.output


def test_run_bad_option_value_names_its_field(runner: CliRunner, module: str) -> None:
    result = runner.invoke(app, ["run", f"{module}:registry", "--workers", "0"])
    assert result.exit_code == 2
    assert "--workers (workers): must be from 1 to 256; got 0" in result.stderr


def test_run_blames_the_flag_not_a_variable(runner: CliRunner, module: str) -> None:
    result = runner.invoke(app, ["run", f"{module}:registry", "--log-format", "yaml"])
    assert result.exit_code == 2
    assert "--log-format (log_format): must be 'auto', 'console' or 'json'" in result.stderr
    assert "NSQWORKER_LOG_FORMAT" not in result.stderr


def test_run_without_any_address_is_one_line_and_exit_2(
    runner: CliRunner, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NSQWORKER_NSQD_TCP_ADDRESSES", raising=False)
    monkeypatch.delenv("NSQWORKER_LOOKUPD_HTTP_ADDRESSES", raising=False)
    result = runner.invoke(app, ["run", f"{module}:registry"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no nsqd or nsqlookupd address to consume from: ")
    assert "--nsqd 127.0.0.1:4150" in result.stderr and len(result.stderr.splitlines()) == 1


def test_publish_without_an_address_points_at_its_flag(
    runner: CliRunner, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NSQWORKER_NSQD_TCP_ADDRESSES", raising=False)
    result = runner.invoke(app, ["publish", "clicks", "{}"])
    assert result.exit_code == 2
    assert "no nsqd address: pass --nsqd HOST:PORT" in result.stderr
    assert "Producer(" not in result.stderr


def test_publish_empty_body_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["publish", "clicks", "", "--nsqd", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "the message body is empty" in result.stderr


def test_the_command_module_imports_no_heavy_dependency() -> None:
    """What keeps `nsqworker --version` quick (0.15 s against 0.87 s when measured).

    rich too (60 ms): an answered `nsqworker rpc call` prints plain JSON, only help and
    errors need it. The command runs to its end, so typer's own imports count as well.
    """
    import subprocess
    import sys

    code = (
        "import sys, nsqworker.cli\n"
        "sys.argv = ['nsqworker', '--version']\n"
        "try:\n    nsqworker.cli.main()\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pydantic', 'pydantic_settings', 'structlog', 'httpx', 'opentelemetry', 'rich'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[0].startswith("nsqworker "), done.stdout
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_rpc_client_and_the_worker_import_httpx_only_for_lookupd() -> None:
    """`nsqworker rpc call --nsqd` and a worker without lookupd skip httpx (~60 ms)."""
    import subprocess
    import sys

    code = (
        "import sys, nsqworker.rpc.client, nsqworker.worker, nsqworker.nsq.transport; "
        "print('httpx' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_module_without_tasks_exits_2(runner: CliRunner, tmp_path: Path, module: str) -> None:
    (tmp_path / "cli_empty.py").write_text("VALUE = 1\n")
    result = runner.invoke(app, ["tasks", "cli_empty"])
    assert result.exit_code == 2
    assert "error: cli_empty declares no tasks" in result.stderr


def test_public_names_stay_what_they_are_after_submodule_imports() -> None:
    import subprocess
    import sys

    code = (
        "import nsqworker.task, nsqworker.worker, nsqworker.settings\n"
        "from nsqworker import task, Worker, Settings, Producer\n"
        "assert task.__name__ == 'task' and Worker.__name__ == 'Worker', (task, Worker)\n"
        "assert Settings.__name__ == 'Settings' and Producer.__name__ == 'Producer'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_bad_topic_shows_only_the_users_frame(
    runner: CliRunner, tmp_path: Path, module: str
) -> None:
    (tmp_path / "cli_bad_topic.py").write_text(
        'from nsqworker import task\n\n@task("bad topic!", channel="c")\nasync def h(msg):\n    pass\n'
    )
    result = runner.invoke(app, ["run", "cli_bad_topic", "--nsqd", "127.0.0.1:4150"])
    assert result.exit_code == 2
    err = result.stderr
    assert 'cli_bad_topic.py", line 3, in <module>' in err
    assert "During handling" not in err and "protocol.py" not in err and "task.py" not in err
    assert err.splitlines()[-1].startswith(
        "could not import cli_bad_topic: TaskDefinitionError: @task('bad topic!', channel='c'): "
        "invalid topic name 'bad topic!'"
    )


def test_run_refuses_the_memory_transport_with_exit_2(runner: CliRunner, module: str) -> None:
    result = runner.invoke(app, ["run", f"{module}:registry", "--transport", "memory"])
    assert result.exit_code == 2
    assert "memory transport lives in one process" in result.stderr


def test_an_unknown_transport_is_a_settings_error_naming_the_choices(
    runner: CliRunner, module: str
) -> None:
    result = runner.invoke(app, ["run", f"{module}:registry", "--transport", "kafka"])
    assert result.exit_code == 2
    assert "--transport" in result.stderr and "the transports are" in result.stderr


def test_tasks_says_the_transport_and_where_it_connects(runner: CliRunner, module: str) -> None:
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": "127.0.0.1:4150"}
    result = runner.invoke(app, ["tasks", f"{module}:registry"], env=env)
    assert result.exit_code == 0, result.output
    assert "on nsq (nsqd 127.0.0.1:4150)" in " ".join(result.stdout.split())


def test_rpc_call_without_an_address_names_the_flag(runner: CliRunner) -> None:
    result = runner.invoke(app, ["rpc", "call", "pricing", "{}"])
    assert result.exit_code == 2
    assert "no nsqd to call through: pass --nsqd HOST:PORT" in " ".join(result.stderr.split())


def test_a_settings_problem_stays_on_one_line_when_not_on_a_terminal(runner: CliRunner) -> None:
    result = runner.invoke(app, ["run", "x.tasks", "--transport", "a-transport-nobody-has-" * 3])
    assert result.exit_code == 2
    (line,) = [line for line in result.stderr.splitlines() if "--transport" in line]
    assert "is not a transport" in line and "got 'a-transport-nobody-has-" in line


def test_plain_flags_show_no_placeholder_in_help(runner: CliRunner) -> None:
    result = runner.invoke(app, ["tasks", "--help"], terminal_width=100)
    (line,) = [line for line in result.stdout.splitlines() if "--json" in line]
    assert "<bool>" not in line
    result = runner.invoke(app, ["run", "--help"], terminal_width=100)
    lines = [line for line in result.stdout.splitlines() if "--reload" in line]
    assert len(lines) >= 2 and not any("<bool>" in line for line in lines)  # -in-cluster too


def _command_paths() -> list[list[str]]:
    """Every command and group of the app, as the words that reach it."""
    paths: list[list[str]] = []

    def walk(command: object, words: list[str]) -> None:
        paths.append(words)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), [])
    return paths


@pytest.mark.parametrize("command", _command_paths(), ids=lambda c: " ".join(c) or "nsqworker")
def test_no_help_shows_a_bool_placeholder(runner: CliRunner, command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "-h" in result.stdout and "<bool>" not in result.stdout


def test_tasks_takes_the_transport_and_its_servers(runner: CliRunner, module: str) -> None:
    args = ["tasks", f"{module}:registry", "--transport", "nats", "--nats", "nats://127.0.0.1:4222"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "on nats (" in result.stdout and "127.0.0.1:4222" in result.stdout
    as_json = runner.invoke(app, [*args, "--json"])
    assert {row["transport"] for row in json.loads(as_json.stdout)} == {"nats"}
    bad = runner.invoke(app, ["tasks", f"{module}:registry", "--transport", "kafka"])
    assert bad.exit_code == 2 and "--transport" in bad.stderr


PIPELINE = """
from nsqworker.task import Registry

registry = Registry()

@registry.task("orders", channel="price", publish_to="priced")
async def price(msg):
    return msg.body

@registry.task("priced", channel="bill", publish_to="billed")
def bill(msg):
    return msg.body

@registry.task("priced", channel="audit")
async def audit(msg):
    pass
"""


def test_tasks_show_the_pipeline_edges(runner: CliRunner, tmp_path: Path, module: str) -> None:
    (tmp_path / f"{module}_pipe.py").write_text(PIPELINE)
    table = runner.invoke(app, ["tasks", f"{module}_pipe:registry"])
    assert table.exit_code == 0, table.output
    name = f"{module}_pipe"
    assert "→ priced" in row(table.stdout, f"{name}.price")
    assert f"pipeline: {name}.price → priced → {name}.bill, {name}.audit" in table.stdout
    assert f"pipeline: {name}.bill → billed → (no task here reads it)" in table.stdout
    as_json = runner.invoke(app, ["tasks", f"{name}:registry", "--json"])
    edges = {t["name"].rpartition(".")[2]: t["publish_to"] for t in json.loads(as_json.stdout)}
    assert edges == {"price": "priced", "bill": "billed", "audit": None}


def test_a_piped_table_keeps_each_row_on_one_line(runner: CliRunner, module: str) -> None:
    """Off a terminal with no COLUMNS (``nsqworker tasks | less``), rows are not wrapped
    to 80 columns: each task is one line, whatever its width."""
    result = runner.invoke(app, ["tasks", f"{module}:registry"], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if f"{module}.build_report" in x]
    assert len(line) > 80 and line.rstrip().endswith("sync") and "alert()" in line
