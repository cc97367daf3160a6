"""``nsqworker dead-letters`` usage, without a broker: what to choose is said before any
connection, bad values exit 2 naming the flag, and a purge on a terminal asks first."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from nsqworker.cli import app, dead_letters

UNREACHABLE = ["--nsqd", "127.0.0.1:1"]  # nothing listens: a connection would fail with 1


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"NSQWORKER_CONFIG": None, "NSQWORKER_TRANSPORT": None})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["replay", "t.dead"], "--all, or --id ID"),
        (["replay", "t.dead", "--all", "--id", "x"], "--all, or --id ID"),
        (["purge", "t.dead"], "one of --all, --id ID"),
        (["purge", "t.dead", "--all", "--older-than", "1h"], "one of --all, --id ID"),
        (["purge", "t.dead", "--older-than", "yesterday"], "--older-than: not a duration"),
        (["list", "bad topic"], "invalid"),
        (["replay", "t.dead", "--all", "--to", "bad topic"], "invalid"),
        (["list", "t.dead", "--transport", "memory"], "cannot be read on transport 'memory'"),
        (["list", "t.dead", "--wait", "0"], "--wait"),
    ],
)
def test_usage_problems_exit_2_before_any_connection(
    runner: CliRunner, args: list[str], says: str
) -> None:
    result = runner.invoke(app, ["dead-letters", *args, *UNREACHABLE])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.stderr.split())


def test_an_unreachable_broker_exits_1_with_one_line(runner: CliRunner) -> None:
    result = runner.invoke(app, ["dead-letters", "list", "t.dead", *UNREACHABLE])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "127.0.0.1:1" in result.stderr


def test_a_purge_on_a_terminal_asks_and_no_removes_nothing(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dead_letters, "_interactive", lambda: True)
    result = runner.invoke(app, ["dead-letters", "purge", "t.dead", "--all", *UNREACHABLE],
                           input="n\n")  # fmt: skip
    assert "Remove every dead letter on t.dead for good?" in result.output
    assert result.exit_code == 1 and "nothing removed" in result.stderr


def test_a_bulk_purge_off_a_terminal_needs_yes(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dead_letters, "_interactive", lambda: False)
    for chosen in (["--all"], ["--older-than", "7d"]):
        result = runner.invoke(app, ["dead-letters", "purge", "t.dead", *chosen, *UNREACHABLE])
        assert result.exit_code == 2, result.output  # refused before any connection
        assert "add --yes" in " ".join(result.stderr.split())
