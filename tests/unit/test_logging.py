"""Logging: JSON and console lines, level filtering, stdlib routing, trace ids."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import structlog

from nsqworker.logging import configure_logging, get_logger

CONSOLE_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \[(\w+)\s*\] (.*)$")


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Each test configures logging its own way; put the process back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


@pytest.fixture
def out() -> io.StringIO:
    return io.StringIO()


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_line_has_the_keys(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    get_logger("nsqworker.test", task="archive").info("finished", topic="clicks", took=0.25)
    (line,) = json_lines(out)
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]
    assert line["level"] == "info"
    assert line["logger"] == "nsqworker.test"
    assert line["event"] == "finished"
    assert (line["task"], line["topic"], line["took"]) == ("archive", "clicks", 0.25)
    assert line["timestamp"].endswith("Z")
    assert datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).utcoffset() is not None
    assert "trace_id" not in line  # no span is active


def test_json_handles_values_json_cannot_encode(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    get_logger("t").info("odd", body=b"\x00raw", when=datetime(2024, 1, 2))
    (line,) = json_lines(out)
    assert line["body"] == "b'\\x00raw'" and line["when"] == "2024-01-02 00:00:00"


def test_json_exception_is_one_line(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("t").exception("handler failed")
    (line,) = json_lines(out)
    assert line["level"] == "error"
    assert "RuntimeError: boom" in line["exception"]


def test_console_line_is_one_line_with_key_values(out: io.StringIO) -> None:
    configure_logging("debug", "console", out)
    get_logger("nsqworker.test").debug("fin", topic="clicks", attempts=2)
    text = out.getvalue()
    assert text.count("\n") == 1
    match = CONSOLE_LINE.match(text.rstrip("\n"))
    assert match, text
    assert match.group(1) == "debug"
    rest = match.group(2)
    assert rest.startswith("fin ")
    assert "topic=clicks" in rest and "attempts=2" in rest and "[nsqworker.test]" in rest
    assert "\x1b[" not in text  # not a terminal: no colours


def test_auto_picks_console_and_colours_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = TTY()
    configure_logging("info", "auto", tty)
    get_logger("t").info("hello")
    assert "\x1b[" in tty.getvalue()
    assert not tty.getvalue().startswith("{")


def test_no_color_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    tty = TTY()
    configure_logging("info", "console", tty)
    get_logger("t").info("hello")
    assert "\x1b[" not in tty.getvalue()


def test_auto_picks_json_off_a_terminal(out: io.StringIO) -> None:
    configure_logging("info", "auto", out)
    get_logger("t").info("hello")
    assert json_lines(out)[0]["event"] == "hello"


def test_level_filtering(out: io.StringIO) -> None:
    configure_logging("WARN", "json", out)
    log = get_logger("t")
    log.debug("no")
    log.info("no")
    log.warning("yes")
    log.error("yes too")
    logging.getLogger("lib").info("no")
    logging.getLogger("lib").error("stdlib yes")
    assert [line["event"] for line in json_lines(out)] == ["yes", "yes too", "stdlib yes"]


def test_disabled_level_skips_attribute_lookup(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    log = get_logger("t")
    log.debug("warm up")
    # The resolved methods live on the logger itself: no __getattr__ on the hot path.
    assert "debug" in vars(log) and "info" in vars(log)
    assert out.getvalue() == ""


def test_stdlib_logging_uses_the_same_pipeline(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("somelib.sub").warning("retrying %s in %.1fs", "x", 1.5, exc_info=True)
    (line,) = json_lines(out)
    assert line["logger"] == "somelib.sub"
    assert line["level"] == "warning"
    assert line["event"] == "retrying x in 1.5s"
    assert "ValueError: bad" in line["exception"]
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]


def test_stdlib_console_line_matches_ours(out: io.StringIO) -> None:
    configure_logging("info", "console", out)
    logging.getLogger("lib").warning("careful")
    get_logger("ours").warning("careful")
    first, second = out.getvalue().splitlines()
    assert CONSOLE_LINE.match(first) and CONSOLE_LINE.match(second)
    assert first.split(" ", 1)[1].replace("[lib]", "") == second.split(" ", 1)[1].replace(
        "[ours]", ""
    )


def test_configure_is_idempotent(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    configure_logging("info", "json", out)
    ours = [h for h in logging.getLogger().handlers if type(h).__name__ == "_Handler"]
    assert len(ours) == 1
    logging.getLogger("lib").warning("once")
    get_logger("t").warning("once")
    assert len(json_lines(out)) == 2


def test_reconfigure_reaches_loggers_already_used() -> None:
    first, second = io.StringIO(), io.StringIO()
    log = get_logger("t")
    configure_logging("info", "json", first)
    log.debug("hidden")
    log.info("to first")
    configure_logging("debug", "console", second)
    log.debug("to second")
    assert [line["event"] for line in json_lines(first)] == ["to first"]
    assert "to second" in second.getvalue() and CONSOLE_LINE.match(second.getvalue().strip())


def test_get_logger_defaults_to_the_calling_module(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    get_logger().info("x")
    assert json_lines(out)[0]["logger"] == __name__


def test_bound_context_and_contextvars(out: io.StringIO) -> None:
    configure_logging("info", "json", out)
    structlog.contextvars.bind_contextvars(worker=3)
    try:
        get_logger("t").bind(topic="clicks").info("x")
    finally:
        structlog.contextvars.clear_contextvars()
    (line,) = json_lines(out)
    assert (line["worker"], line["topic"]) == (3, "clicks")


@pytest.mark.parametrize(("level", "fmt"), [("loud", "json"), ("info", "xml")])
def test_bad_arguments(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="use one of"):
        configure_logging(level, fmt, io.StringIO())


def test_trace_ids_inside_a_span(out: io.StringIO) -> None:
    from opentelemetry.sdk import trace as sdk_trace  # a dependency of nsqworker

    tracer = sdk_trace.TracerProvider().get_tracer("test")  # a local provider, not the global
    configure_logging("info", "json", out)
    log = get_logger("t")
    with tracer.start_as_current_span("process clicks") as span:
        log.info("inside")
        logging.getLogger("lib").info("stdlib inside")
        ctx = span.get_span_context()
    log.info("outside")
    inside, stdlib_inside, outside = json_lines(out)
    for line in (inside, stdlib_inside):
        assert line["trace_id"] == format(ctx.trace_id, "032x")
        assert line["span_id"] == format(ctx.span_id, "016x")
        assert len(line["trace_id"]) == 32 and len(line["span_id"]) == 16
    assert "trace_id" not in outside and "span_id" not in outside


def test_console_line_escapes_control_characters_of_every_value(out: io.StringIO) -> None:
    configure_logging("info", "console", out)
    get_logger("nsqworker.test").error(
        "dead-letter", id="[/]\x1b[2J", reason="tags.evil\nkey\u2028: invalid"
    )
    text = out.getvalue()
    assert text.count("\n") == 1 and "\x1b" not in text and "\u2028" not in text
    assert "id=[/]\\x1b[2J" in text  # shown as is when plain, quoted with a space:
    assert "reason='tags.evil\\\\nkey\\\\u2028: invalid'" in text
