"""What ``@task`` checks at import: its options and its handler, each problem named
with what to change (:class:`TaskDefinitionError`)."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from typing import Any, Never

from nsqworker.bodies import BodySpec, body_spec
from nsqworker.errors import ConfigurationError, InvalidName
from nsqworker.message import MAX_RETRY_DELAY, is_retry_delay
from nsqworker.names import check_channel, check_topic
from nsqworker.time_limits import TIMEOUT_ACTIONS

MAX_IN_FLIGHT = 1_000_000
MAX_ATTEMPTS = 65535
MAX_TIMEOUT = 7 * 86400.0
OPTIONS = (
    "channel", "max_in_flight", "max_attempts", "retry_delay", "on_dead_letter", "timezone",
    "dead_letter_topic", "name", "envelope", "timeout", "hooks", "publish_to", "schedule",
    "timeout_action",
)  # fmt: skip


class TaskDefinitionError(ConfigurationError, TypeError):
    """Raised at import when a ``@task`` declaration cannot work; says what to change."""


def fail(where: str, problem: str) -> Never:
    raise TaskDefinitionError(f"{where}: {problem}")


def renamed_option(where: str, old: str, new: str, old_value: Any, value: Any) -> Any:
    """An option given by its old name: one log line naming the new one; never both."""
    if old_value is None:
        return value
    if value is not None:
        fail(where, f"{old} is the old name of {new}; give only {new}")
    logging.getLogger("nsqworker.task").warning("%s: %s is deprecated; use %s", where, old, new)
    return old_value


def _check_int(where: str, option: str, value: object, low: int, high: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        fail(where, f"{option} must be a whole number from {low} to {high}, got {value!r}")


def check_options(where: str, topic: str, options: dict[str, Any]) -> None:
    """Check every option given to ``@task`` apart from the handler itself."""
    for option, what, check in (
        ("topic", "topic", check_topic),
        ("channel", "channel", check_channel),
    ):
        value = topic if option == "topic" else options["channel"]
        try:
            check(value)
        except InvalidName as exc:
            fail(where, f"{exc}; change the {what} name")
    _check_int(where, "max_in_flight", options["max_in_flight"], 1, MAX_IN_FLIGHT)
    _check_int(where, "max_attempts", options["max_attempts"], 1, MAX_ATTEMPTS)
    delay = options["retry_delay"]
    if delay is not None and not is_retry_delay(delay):
        fail(where, f"retry_delay must be seconds from 0 to {MAX_RETRY_DELAY:g}, got {delay!r}")
    dlt = options["dead_letter_topic"]
    if dlt is not None:
        try:
            check_topic(dlt)
        except InvalidName as exc:
            fail(where, f"dead_letter_topic: {exc}")
        if dlt == topic:
            fail(
                where,
                f"dead_letter_topic {dlt!r} is the task's own topic, so dead "
                "letters would come straight back; use another topic, like "
                f"{topic + '.dead'!r}",
            )
    hook = options["on_dead_letter"]
    if hook is not None:
        if not callable(hook):
            fail(where, f"on_dead_letter must be a function (msg, reason), got {hook!r}")
        if not _accepts(hook, 2):
            fail(
                where,
                f"on_dead_letter {function_name(hook)} must take two positional "
                "parameters: def hook(msg: Message, reason: str)",
            )
    name = options["name"]
    if name is not None and (not isinstance(name, str) or not name.strip()):
        fail(where, f"name must be a non-empty string, got {name!r}")
    envelope = options["envelope"]
    if envelope is not None and not isinstance(envelope, bool):
        fail(where, f"envelope must be True, False or None, got {envelope!r}")
    timeout = options["timeout"]
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        fail(where, f"timeout must be seconds above 0, at most {MAX_TIMEOUT:g}, got {timeout!r}")
    action = options["timeout_action"]
    if action is not None and action not in TIMEOUT_ACTIONS:
        choices = ", ".join(repr(a) for a in TIMEOUT_ACTIONS)
        fail(where, f"timeout_action must be one of {choices}, got {action!r}")
    publish_to = options["publish_to"]
    if publish_to is not None:
        try:
            check_topic(publish_to)
        except InvalidName as exc:
            fail(where, f"publish_to: {exc}")
    hooks = options["hooks"]
    if hooks is not None and (isinstance(hooks, str | bytes) or not hasattr(hooks, "__iter__")):
        fail(where, f"hooks must be a list of hook objects, got {hooks!r}")


def _accepts(func: Callable[..., Any], count: int) -> bool:
    """Whether ``func`` can be called with ``count`` positional arguments."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return True
    try:
        signature.bind(*([None] * count))
    except TypeError:
        return False
    return True


def function_name(func: object) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or func)


def check_handler(where: str, func: object) -> BodySpec | None:
    """Check the handler; return its typed body, if it declares one."""
    if not callable(func):
        fail(where, f"@task decorates a function taking the message, got {func!r}")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        fail(
            where,
            f"{function_name(func)} is a generator (it uses yield); a handler must "
            "return or raise, so remove the yield",
        )
    body = body_spec(func)
    if isinstance(body, str):
        fail(where, f"{function_name(func)}: {body}")
    takes = 2 if body is not None and body.with_message else 1
    if not _accepts(func, takes) or _accepts(func, takes + 1):
        name = getattr(func, "__name__", "handler")
        fail(
            where,
            f"{function_name(func)} must take the message, or its typed body, or both: "
            f"def {name}(msg: Message), def {name}(click: Click) or "
            f"def {name}(msg: Message, click: Click)",
        )
    return body
