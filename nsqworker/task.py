"""Declaring tasks: ``@task``, ``TaskSpec``, ``Registry``, and what a handler's result means.

A task binds a handler to one topic and channel (on any transport)::

    from nsqworker import task, Message, Retry, Reject

    @task("clicks", channel="archive", max_in_flight=100, max_attempts=5)
    async def archive(msg: Message) -> None:
        await store(msg.json())

Everything is checked when the module is imported: names, bounds, the handler's signature,
duplicates. The decorator returns the function itself (with ``.spec``), so tests can call it.

What a handler's result means (finish, retry, reject) is in :mod:`nsqworker.outcomes`;
a handler may take the message, its typed body (:mod:`nsqworker.bodies`) or both, and
hooks may run around it (:mod:`nsqworker.hooks`).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Never, ParamSpec, Protocol, TypeVar, cast

from nsqworker.bodies import BodySpec
from nsqworker.hooks import (
    AfterHook,
    BeforeHook,
    DeadLetterHook,
    ErrorHook,
    Hooks,
    hooks_of,
    is_async_callable,
)
from nsqworker.message import Message
from nsqworker.outcomes import (
    Publish,
    Reject,
    Retry,
    TaskTimeout,
    describe_outcome,
    outcome_of_error,
    outcome_of_return,
)
from nsqworker.task_checks import (
    OPTIONS,
    TaskDefinitionError,
    check_handler,
    check_options,
    fail,
    function_name,
    renamed_option,
)

if TYPE_CHECKING:
    from nsqworker.schedules.cron import Schedule
    from nsqworker.time_limits import TimeoutAction

__all__ = [
    "DeadLetterHook",
    "Publish",
    "Registry",
    "Reject",
    "Retry",
    "TaskDefinitionError",
    "TaskFunction",
    "TaskImportError",
    "TaskSpec",
    "TaskTimeout",
    "default_registry",
    "describe_outcome",
    "load_registry",
    "outcome_of_error",
    "outcome_of_return",
    "task",
]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


# --- declaring tasks ------------------------------------------------------------------


class TaskImportError(ImportError):
    """Raised by :func:`load_registry` when the tasks module cannot be imported or holds
    no tasks. ``traceback_text`` is the original traceback, for the CLI to show."""

    def __init__(self, message: str, *, module: str, traceback_text: str = "") -> None:
        super().__init__(message, name=module)
        self.module = module
        self.traceback_text = traceback_text


@dataclass(frozen=True)
class TaskSpec:
    """One task as declared. Options left None take the worker's ``Settings`` defaults."""

    name: str
    topic: str
    channel: str
    func: Callable[[Message], Any]
    is_async: bool
    max_in_flight: int | None = None
    max_attempts: int | None = None
    retry_delay: float | None = None
    on_dead_letter: DeadLetterHook | None = None
    dead_letter_topic: str | None = None
    envelope: bool | None = None
    module: str = ""
    timeout: float | None = None
    """Seconds the handler may run (None: the ``task_timeout`` setting, unset = no limit)."""
    timeout_action: str | None = None
    """``retry``, ``dead_letter`` or ``abandon`` (None: the ``timeout_action`` setting)."""
    hooks: Hooks = field(default_factory=Hooks)
    """The task's own hooks (the registry's run first)."""
    body: BodySpec | None = None
    """The body's type when the handler declares one (typed bodies), else None."""
    publish_to: str | None = None
    """Where the handler's return value is published before the finish (None: nowhere)."""
    schedule: Schedule | None = None
    """When the task fires on its own (``schedule=``), else None; docs/schedules.md."""

    @property
    def location(self) -> str:
        """``module.qualname (file:line)`` of the handler, for messages."""
        code = getattr(self.func, "__code__", None)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        qualname = getattr(self.func, "__qualname__", repr(self.func))
        return f"{getattr(self.func, '__module__', '?')}.{qualname}{where}"

    @property
    def requeue_delay(self) -> float | None:
        """Deprecated: the old name of :attr:`retry_delay`."""
        return self.retry_delay


class TaskFunction(Protocol, Generic[P, R_co]):
    """A handler decorated with ``@task``: still callable as before, plus its ``spec``."""

    spec: TaskSpec

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


class Registry:
    """A set of tasks, each with a unique name and a unique (topic, channel).

    ``@registry.task(...)`` declares one; iterating yields the :class:`TaskSpec` in
    declaration order. :data:`default_registry` backs the module-level :func:`task`.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, TaskSpec] = {}
        #: Hooks every task of this registry runs (see :mod:`nsqworker.hooks`).
        self.hooks = Hooks()

    def before(self, hook: BeforeHook) -> BeforeHook:
        """Decorator: ``hook(msg)`` runs before every handler of this registry."""
        self.hooks += Hooks(before=(_hook_callable(hook, "before"),))
        return hook

    def after(self, hook: AfterHook) -> AfterHook:
        """Decorator: ``hook(msg, outcome, error, duration)`` runs once each message's
        outcome is decided (``outcome`` None: the handler answered itself)."""
        self.hooks += Hooks(after=(_hook_callable(hook, "after"),))
        return hook

    def on_error(self, hook: ErrorHook) -> ErrorHook:
        """Decorator: ``hook(msg, error)`` runs when a handler raises."""
        self.hooks += Hooks(on_error=(_hook_callable(hook, "on_error"),))
        return hook

    def on_dead_letter(self, hook: DeadLetterHook) -> DeadLetterHook:
        """Decorator: ``hook(msg, reason)`` runs for each message rejected (after the
        task's own dead-letter topic and hook); if it raises, the message is retried."""
        self.hooks += Hooks(on_dead_letter=(_hook_callable(hook, "on_dead_letter"),))
        return hook

    def add_hooks(self, *hooks: object) -> None:
        """Add hook objects (with any of ``before``, ``after``, ``on_error``,
        ``on_dead_letter``) to every task of this registry."""
        self.hooks += hooks_of(hooks, "Registry.add_hooks")

    def __iter__(self) -> Iterator[TaskSpec]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __repr__(self) -> str:
        return f"<Registry {', '.join(self._by_name) or '(empty)'}>"

    def get(self, name: str) -> TaskSpec | None:
        """The task called ``name``, or None."""
        return self._by_name.get(name)

    def task(
        self,
        topic: str,
        *,
        channel: str,
        max_in_flight: int | None = None,
        max_attempts: int | None = None,
        retry_delay: float | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        dead_letter_topic: str | None = None,
        name: str | None = None,
        envelope: bool | None = None,
        timeout: float | None = None,
        timeout_action: TimeoutAction | None = None,
        hooks: list[object] | tuple[object, ...] | None = None,
        publish_to: str | None = None,
        schedule: str | list[str] | tuple[str, ...] | None = None,
        timezone: str | None = None,
        requeue_delay: float | None = None,
        **unknown: Never,
    ) -> Callable[[Callable[P, R]], TaskFunction[P, R]]:
        """Declare the decorated function as the handler of ``topic`` on ``channel``.

        Args:
            topic: the topic to consume (NSQ topic, JetStream stream, RabbitMQ stream).
            channel: the channel to subscribe with; every channel gets its own copy
                of each message, so two tasks on one topic need two channels.
            max_in_flight: messages handled at once (default ``Settings.max_in_flight``);
                for a sync handler also the size of its thread pool.
            max_attempts: deliveries before the message goes to the dead-letter hooks
                (default ``Settings.max_attempts``).
            retry_delay: seconds of the first retry after a failure, growing
                exponentially with attempts (default ``Settings.retry_delay``).
                ``requeue_delay``, its old name, still works (deprecated).
            on_dead_letter: ``hook(msg, reason)`` called when the message is rejected;
                a plain function runs in a thread, an ``async def`` on the loop.
            dead_letter_topic: also publish rejected messages there, as JSON.
            name: the task's name (default ``module.qualname``).
            envelope: whether bodies carry the trace-context envelope (default: the
                ``tracing_envelope`` setting).
            timeout: seconds the handler may run before the message is retried (an
                attempt counted); default: the ``task_timeout`` setting (unset: none).
                An ``async def`` handler is cancelled; a plain one cannot be, so its
                thread keeps its slot until it returns and the worker process is
                replaced after a drain (docs/tasks.md, "Time limits").
            timeout_action: what the time limit does: ``retry`` (as above),
                ``dead_letter`` (at the first one) or ``abandon`` (a plain handler's
                thread is left running, the process kept); default: the
                ``timeout_action`` setting (``retry``).
            hooks: objects with any of ``before``, ``after``, ``on_error`` and
                ``on_dead_letter`` methods, run for this task after the registry's.
            publish_to: publish the handler's return value to this topic, on the
                task's transport, before the message is acknowledged (None returned:
                nothing published). A publish that fails fails the attempt (retried,
                then dead-lettered), so a result may be published twice, never lost.
                A handler may also return :class:`Publish` values, with or without it.
            schedule: a cron expression (5 fields, or 6 with seconds first), or a list
                of them: at each tick the schedule leader publishes
                ``{"task": name, "scheduled_for": "<UTC>"}`` to ``topic``, once across
                every replica (docs/schedules.md).
            timezone: the IANA time zone of ``schedule`` (default UTC); daylight saving
                time is handled as Debian's cron does.

        Raises:
            TaskDefinitionError: at import, naming the problem and what to change.
        """
        where = f"@task({topic!r}, channel={channel!r})"
        if unknown:
            problems = []
            for key in unknown:
                close = difflib.get_close_matches(key, OPTIONS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(f"{key!r}{hint}")
            fail(
                where, f"unknown option {', '.join(problems)}; the options are {', '.join(OPTIONS)}"
            )
        options: dict[str, Any] = {
            "channel": channel,
            "max_in_flight": max_in_flight,
            "max_attempts": max_attempts,
            "retry_delay": renamed_option(
                where, "requeue_delay", "retry_delay", requeue_delay, retry_delay
            ),
            "on_dead_letter": on_dead_letter,
            "dead_letter_topic": dead_letter_topic,
            "name": name,
            "envelope": envelope,
            "timeout": timeout,
            "timeout_action": timeout_action,
            "hooks": hooks,
            "publish_to": publish_to,
        }
        check_options(where, topic, options)
        try:
            task_hooks = hooks_of(hooks or (), where)
        except TypeError as exc:
            fail(where, str(exc).removeprefix(f"{where}: "))

        if timezone is not None and schedule is None:
            fail(where, f"timezone={timezone!r} needs schedule=... (a cron expression)")

        def decorate(func: Callable[P, R]) -> TaskFunction[P, R]:
            body = check_handler(where, func)
            module = str(getattr(func, "__module__", None) or "")
            task_name = name or f"{module}.{function_name(func)}"
            spec = TaskSpec(
                name=task_name,
                topic=topic,
                channel=channel,
                func=cast("Callable[[Message], Any]", func),
                is_async=is_async_callable(func),
                max_in_flight=max_in_flight,
                max_attempts=max_attempts,
                retry_delay=None
                if options["retry_delay"] is None
                else float(options["retry_delay"]),
                on_dead_letter=on_dead_letter,
                dead_letter_topic=dead_letter_topic,
                envelope=envelope,
                module=module,
                timeout=None if timeout is None else float(timeout),
                timeout_action=timeout_action,
                hooks=task_hooks,
                body=body,
                publish_to=publish_to,
                schedule=_schedule(f"{where}, task {task_name!r}", schedule, timezone),
            )
            self.add(spec)
            func.spec = spec  # type: ignore[attr-defined]
            return func  # type: ignore[return-value]

        return decorate

    def add(self, spec: TaskSpec) -> None:
        """Add a declared task; a duplicate name or (topic, channel) is an error.

        Declaring the same function again (a module reloaded) replaces it.
        """
        for other in list(self._by_name.values()):
            same_func = _same_function(other, spec)
            if other.name == spec.name and not same_func:
                fail(
                    f"task {spec.name!r}",
                    f"the name is taken by {other.location} and {spec.location}; "
                    "pass name=... to one of them",
                )
            if (other.topic, other.channel) == (spec.topic, spec.channel) and not same_func:
                fail(
                    f"@task({spec.topic!r}, channel={spec.channel!r})",
                    f"both {other.location} and {spec.location} subscribe to it, so each "
                    "would get half the messages; give one of them another channel",
                )
            if same_func:
                del self._by_name[other.name]
        self._by_name[spec.name] = spec
        if self is default_registry:
            for captured in _captures:
                captured.append(spec.name)


def _schedule(where: str, schedule: Any, timezone: str | None) -> Schedule | None:
    """The checked :class:`~nsqworker.schedules.cron.Schedule` of ``schedule=``, or None."""
    if schedule is None:
        return None
    from nsqworker.schedules.cron import Schedule, ScheduleError

    try:
        return Schedule.of(schedule, timezone)
    except ScheduleError as exc:
        problem = str(exc)
    fail(where, problem)  # outside the except: the user's frame alone, not cronsim's


def _hook_callable(hook: Any, kind: str) -> Any:
    if not callable(hook):
        raise TaskDefinitionError(f"Registry.{kind}: a hook must be a function, got {hook!r}")
    return hook


def _same_function(a: TaskSpec, b: TaskSpec) -> bool:
    return (a.name, a.module, function_name(a.func)) == (b.name, b.module, function_name(b.func))


default_registry = Registry()
"""The registry ``@task`` (and ``nsqworker run pkg.module``) uses."""

task = default_registry.task
"""Declare a handler in :data:`default_registry`; see :meth:`Registry.task`."""


# --- finding tasks from the command line ----------------------------------------------

_captures: list[list[str]] = []
_loaded: dict[str, list[str]] = {}


def load_registry(target: str) -> Registry:
    """Import ``"pkg.module"`` or ``"pkg.module:attr"`` and return its tasks.

    With ``:attr``, the module's attribute (a :class:`Registry`) is returned. Without,
    the tasks that importing the module declared in :data:`default_registry` are
    returned as a new registry (tasks of other modules imported earlier are left out).
    The current directory is put on ``sys.path`` first, as ``python -m`` would.

    Raises:
        TaskImportError: the module fails to import (``traceback_text`` holds the
            original traceback), the attribute is missing or not a Registry, or there
            are no tasks.
    """
    module_name, _, attr = target.partition(":")
    module_name = module_name.strip()
    if not module_name or module_name.endswith(".py") or "/" in module_name:
        raise TaskImportError(
            f"{target!r} is not a module path; write it like myservice.tasks or "
            "myservice.tasks:registry",
            module=module_name,
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    captured: list[str] = []
    _captures.append(captured)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise _import_failure(module_name, exc) from exc
    finally:
        _captures.remove(captured)
    if attr:
        return _registry_attribute(module, module_name, attr)
    names = set(_loaded.setdefault(module_name, []))
    names.update(captured)
    _loaded[module_name] = sorted(names)
    prefix = module_name + "."
    registry = Registry()
    for spec in default_registry:
        if spec.name in names or spec.module == module_name or spec.module.startswith(prefix):
            registry.add(spec)
    if not registry:
        raise TaskImportError(
            f"{module_name} declares no tasks; decorate handlers with @task(...) from "
            "nsqworker, or name a Registry as module:attribute",
            module=module_name,
        )
    return registry


def _registry_attribute(module: Any, module_name: str, attr: str) -> Registry:
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TaskImportError(f"{module_name} has no attribute {attr!r}", module=module_name)
        obj = getattr(obj, part)
    if not isinstance(obj, Registry):
        raise TaskImportError(
            f"{module_name}:{attr} is a {type(obj).__name__}, not an nsqworker Registry",
            module=module_name,
        )
    if not obj:
        raise TaskImportError(f"{module_name}:{attr} holds no tasks", module=module_name)
    return obj


def _import_failure(module_name: str, exc: Exception) -> TaskImportError:
    text = "".join(traceback.format_exception(exc))
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing and (module_name == missing or module_name.startswith(missing + ".")):
        parent, _, leaf = missing.rpartition(".")
        where = getattr(sys.modules.get(parent), "__path__", None)
        if where:  # the package is there, the module is not
            hint = f"package {parent} ({', '.join(where)}) has no module {leaf!r}"
        else:
            hint = (
                "run from the directory that holds it or add that directory to PYTHONPATH "
                f"(current directory: {os.getcwd()})"
            )
        return TaskImportError(
            f"no module named {missing!r}: {hint}", module=module_name, traceback_text=text
        )
    return TaskImportError(
        f"importing {module_name} failed: {type(exc).__name__}: {exc}",
        module=module_name,
        traceback_text=text,
    )
