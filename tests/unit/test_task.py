"""@task, TaskSpec, Registry, load_registry and the handler outcome mapping (no broker)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pickle
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from nsqworker.dispatch import DEFERRED
from nsqworker.errors import AlreadyResponded, ConfigurationError
from nsqworker.memory import MemoryTransport
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nsq.transport import CAPABILITIES
from nsqworker.policy import retry_delay as policy_retry_delay
from nsqworker.settings import Settings
from nsqworker.stats import DURATION_BUCKETS
from nsqworker.task import (
    Registry,
    Reject,
    Retry,
    TaskDefinitionError,
    TaskImportError,
    TaskSpec,
    default_registry,
    describe_outcome,
    load_registry,
    outcome_of_error,
    outcome_of_return,
)
from nsqworker.task_runner import TaskRunner as _TaskRunner
from nsqworker.task_runner import dead_letter_envelope

# --- helpers --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def quiet_logs() -> Any:
    """Failures log tracebacks at WARNING; rendering them is slow and not under test."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


class FakeOwner:
    """Records what a message asked its owner to send; stands in for the dispatcher."""

    def __init__(self) -> None:
        self.settled: list[Outcome] = []
        self.touched = 0
        self.threads: list[int] = []

    def settle(self, message: Message, outcome: Outcome) -> None:
        self.settled.append(outcome)
        self.threads.append(threading.get_ident())

    def touch(self, message: Message) -> None:
        self.touched += 1


def make_message(body: bytes = b"{}", attempts: int = 1) -> tuple[Message, FakeOwner]:
    owner = FakeOwner()
    msg = Message(b"0123456789abcdef", body, 1_700_000_000_000_000_000, attempts, "t", "c",
                  "127.0.0.1:4150", owner)  # fmt: skip
    return msg, owner


async def handler(msg: Message) -> None:
    pass


def sync_handler(msg: Message) -> None:
    pass


def hook(msg: Message, reason: str) -> None:
    pass


def declare(**options: Any) -> Any:
    """Declare ``handler`` in a fresh registry with ``options``; return the error if any."""
    options.setdefault("channel", "c")
    topic = options.pop("topic", "t")
    func = options.pop("func", handler)
    with pytest.raises(TaskDefinitionError) as info:
        Registry().task(topic, **options)(func)
    return str(info.value)


# --- declaring ------------------------------------------------------------------------


def test_decorator_returns_the_function_with_its_spec() -> None:
    reg = Registry()

    @reg.task("clicks", channel="archive", max_in_flight=100, max_attempts=5)
    def archive(msg: Message) -> int:
        return len(msg.body)

    msg, _ = make_message(b"abc")
    assert archive(msg) == 3  # still directly callable, same signature
    assert archive.__name__ == "archive"
    spec = archive.spec
    assert isinstance(spec, TaskSpec)
    assert (spec.topic, spec.channel, spec.max_in_flight, spec.max_attempts) == (
        "clicks", "archive", 100, 5,
    )  # fmt: skip
    assert (
        spec.name
        == f"{__name__}.test_decorator_returns_the_function_with_its_spec.<locals>.archive"
    )
    assert spec.module == __name__
    assert spec.is_async is False
    assert spec.retry_delay is None and spec.on_dead_letter is None
    assert list(reg) == [spec] and len(reg) == 1
    assert reg.get(spec.name) is spec and spec.name in reg
    assert reg.get("nope") is None


def test_async_handler_is_detected_and_still_awaitable() -> None:
    reg = Registry()

    @reg.task("clicks", channel="c", name="clicks.c", retry_delay=2, envelope=True)
    async def handle(msg: Message) -> str:
        return msg.topic

    assert handle.spec.is_async and handle.spec.name == "clicks.c"
    assert handle.spec.retry_delay == 2.0 and handle.spec.envelope is True
    msg, _ = make_message()
    assert asyncio.run(handle(msg)) == "t"


def test_async_callable_object_counts_as_async() -> None:
    class Handler:
        async def __call__(self, msg: Message) -> None:
            pass

    spec = Registry().task("t", channel="c", name="obj")(Handler()).spec
    assert spec.is_async


def test_module_level_task_uses_the_default_registry() -> None:
    from nsqworker.task import task

    name = f"test-{uuid.uuid4().hex}"
    topic = f"t{uuid.uuid4().hex[:8]}"
    task(topic, channel="c", name=name)(handler)
    assert default_registry.get(name) is not None


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"topic": "bad topic"}, ["invalid topic name 'bad topic'", "change the topic name"]),
        ({"topic": "x" * 65}, ["1 to 64 characters", "change the topic name"]),
        ({"channel": "bad/chan"}, ["invalid channel name 'bad/chan'", "change the channel name"]),
        ({"max_in_flight": 0}, ["max_in_flight must be a whole number from 1 to 1000000, got 0"]),
        ({"max_in_flight": 1_000_001}, ["max_in_flight", "1000000", "got 1000001"]),
        ({"max_in_flight": "10"}, ["max_in_flight", "got '10'"]),
        ({"max_in_flight": True}, ["max_in_flight", "got True"]),
        ({"max_attempts": 0}, ["max_attempts must be a whole number from 1 to 65535, got 0"]),
        ({"retry_delay": -1}, ["retry_delay must be seconds from 0 to 3600, got -1"]),
        ({"retry_delay": 3601}, ["retry_delay", "got 3601"]),
        ({"retry_delay": float("nan")}, ["retry_delay", "got nan"]),
        ({"dead_letter_topic": "no spaces"}, ["dead_letter_topic: invalid topic name"]),
        ({"dead_letter_topic": "t"}, ["is the task's own topic", "use another topic, like 't.dead'"]),
        ({"on_dead_letter": "alert"}, ["on_dead_letter must be a function (msg, reason)"]),
        ({"on_dead_letter": lambda msg: None}, ["must take two positional parameters", "def hook(msg: Message, reason: str)"]),
        ({"name": ""}, ["name must be a non-empty string"]),
        ({"envelope": "yes"}, ["envelope must be True, False or None"]),
    ],
)  # fmt: skip
def test_invalid_options_say_what_to_change(options: dict[str, Any], expected: list[str]) -> None:
    text = declare(**options)
    assert text.startswith("@task(")  # names the declaration
    for part in expected:
        assert part in text, text


def test_errors_are_configuration_and_type_errors() -> None:
    assert issubclass(TaskDefinitionError, ConfigurationError)
    assert issubclass(TaskDefinitionError, ValueError)
    assert issubclass(TaskDefinitionError, TypeError)


def test_unknown_option_lists_the_valid_ones_and_suggests_one() -> None:
    with pytest.raises(TypeError) as info:
        Registry().task("t", channel="c", max_inflight=3)  # type: ignore[arg-type]
    text = str(info.value)
    assert "unknown option 'max_inflight' (did you mean max_in_flight?)" in text
    assert "the options are channel, max_in_flight, max_attempts, retry_delay" in text


def test_unknown_option_without_a_close_match() -> None:
    with pytest.raises(TypeError, match="unknown option 'zzz'; the options are"):
        Registry().task("t", channel="c", zzz=1)  # type: ignore[arg-type]


def test_channel_is_required() -> None:
    with pytest.raises(TypeError, match="channel"):
        Registry().task("t")(handler)  # type: ignore[call-arg]


def test_handler_must_take_the_message_or_its_typed_body_or_both() -> None:
    def none() -> None:
        pass

    def optional_second(msg: Message, other: int = 0) -> None:
        pass

    def three(msg: Message, body: int, more: int) -> None:
        pass

    for func in (none, optional_second, three):
        text = declare(func=func)
        assert "must take the message, or its typed body, or both" in text
        assert f"def {func.__name__}(msg: Message)" in text


def test_generators_are_refused() -> None:
    def gen(msg: Message) -> Any:
        yield msg

    async def agen(msg: Message) -> Any:
        yield msg

    for func in (gen, agen):
        text = declare(func=func)
        assert "is a generator (it uses yield)" in text and "remove the yield" in text


def test_non_callable_is_refused() -> None:
    assert "decorates a function taking the message" in declare(func=42)


def test_duplicate_topic_channel_names_both_functions() -> None:
    reg = Registry()

    @reg.task("clicks", channel="archive")
    async def first(msg: Message) -> None:
        pass

    with pytest.raises(TaskDefinitionError) as info:

        @reg.task("clicks", channel="archive")
        async def second(msg: Message) -> None:
            pass

    text = str(info.value)
    assert "first" in text and "second" in text and "test_task.py:" in text
    assert "give one of them another channel" in text
    # another channel on the same topic is fine
    reg.task("clicks", channel="other")(handler)
    assert len(reg) == 2


def test_duplicate_name_names_both_functions() -> None:
    reg = Registry()
    reg.task("a", channel="c", name="same")(handler)
    with pytest.raises(TaskDefinitionError) as info:
        reg.task("b", channel="c", name="same")(sync_handler)
    text = str(info.value)
    assert "'same'" in text and ".handler" in text and ".sync_handler" in text
    assert "pass name=... to one of them" in text


def test_redeclaring_the_same_function_replaces_it() -> None:
    reg = Registry()
    reg.task("a", channel="c")(handler)
    reg.task("a", channel="c", max_attempts=9)(handler)  # a reloaded module
    assert len(reg) == 1 and next(iter(reg)).max_attempts == 9


def test_retry_and_reject() -> None:
    assert Retry().delay is None and str(Retry()) == "retry"
    retry = Retry(30, "not ready")
    assert retry.delay == 30.0 and retry.reason == "not ready"
    assert str(retry) == "retry in 30s: not ready"
    for bad in (-1, 3601, "5", True):
        with pytest.raises(ValueError, match="give seconds from 0 to 3600"):
            Retry(bad)  # type: ignore[arg-type]
    assert Reject("malformed").reason == "malformed" and str(Reject()) == "rejected"
    copy = pickle.loads(pickle.dumps(retry))
    assert (copy.delay, copy.reason, str(copy)) == (30.0, "not ready", str(retry))
    assert pickle.loads(pickle.dumps(Reject())).reason == ""


# --- outcome mapping --------------------------------------------------------------------


def test_outcome_of_return() -> None:
    msg, _ = make_message()
    assert outcome_of_return(msg) is FINISH
    msg.finish()
    assert outcome_of_return(msg) is None


@pytest.mark.parametrize(
    ("exc", "kind", "delay", "backoff"),
    [
        (Retry(5), Retry, 5.0, True),
        (Retry(), Retry, None, True),
        (ValueError("boom"), Retry, None, True),
        (asyncio.CancelledError(), Retry, 0.0, False),
    ],
)
def test_outcome_of_error_retries(
    exc: BaseException, kind: type, delay: Any, backoff: bool
) -> None:
    msg, _ = make_message()
    outcome = outcome_of_error(msg, exc)
    assert isinstance(outcome, kind)
    assert (outcome.delay, outcome.backoff) == (delay, backoff)


def test_outcome_of_reject_is_reject() -> None:
    msg, _ = make_message()
    raised = Reject("malformed")
    assert outcome_of_error(msg, raised) is raised  # the exception is the outcome
    outcome = outcome_of_error(msg, Reject())
    assert isinstance(outcome, Reject) and outcome.reason == "rejected by the handler"


def test_a_raised_retry_is_its_own_outcome() -> None:
    """One vocabulary: the exception a handler raises is the outcome the worker applies,
    a subclass and ``backoff=False`` included."""

    class Busy(Retry):
        pass

    msg, _ = make_message()
    for raised in (Retry(5, "busy"), Busy(1), Retry(backoff=False)):
        assert outcome_of_error(msg, raised) is raised


def test_retry_outcome_checks_and_pickles() -> None:
    with pytest.raises(ValueError, match="from 0 to 3600"):
        Retry(3601)
    with pytest.raises(ValueError, match="from 0 to 3600"):
        Retry(-1)
    again = pickle.loads(pickle.dumps(Retry(2.5, "busy", backoff=False)))
    assert (again.delay, again.reason, again.backoff) == (2.5, "busy", False)
    assert pickle.loads(pickle.dumps(Reject("bad"))).reason == "bad"


def test_msg_retry_checks_its_delay_and_requeue_keeps_its_old_leniency() -> None:
    msg, owner = make_message()
    with pytest.raises(ValueError, match="from 0 to 3600"):
        msg.retry(7200)
    assert not msg.responded and owner.settled == []  # nothing sent for a bad call
    msg.requeue(7200, backoff=False)  # the deprecated name: brought within 0..3600
    (outcome,) = owner.settled
    assert isinstance(outcome, Retry) and (outcome.delay, outcome.backoff) == (3600.0, False)


def test_no_outcome_after_the_handler_answered() -> None:
    msg, owner = make_message()
    msg.retry(3)
    assert outcome_of_error(msg, ValueError()) is None
    assert len(owner.settled) == 1
    with pytest.raises(AlreadyResponded):
        msg.finish()
    assert len(owner.settled) == 1


def test_describe_outcome() -> None:
    assert describe_outcome(FINISH) == "finished"
    assert describe_outcome(Retry(5.0)) == "retry in 5s"
    assert describe_outcome(Retry(None)) == "retry"
    assert describe_outcome(Reject("x")) == "rejected"
    assert describe_outcome(None) == "answered"


# --- the worker's callback: handler -> outcome, with a fake owner ------------------------


def runner_for(func: Any, **options: Any) -> _TaskRunner:
    spec = Registry().task("t", channel="c", **options)(func).spec
    settings = Settings(nsqd_tcp_addresses=["127.0.0.1:4150"])
    transport = MemoryTransport()
    transport.capabilities = CAPABILITIES  # the spans and logs of an NSQ task
    return _TaskRunner(spec, settings, transport)


async def run_callback(runner: _TaskRunner, msg: Message) -> Outcome | None:
    """Run the dispatcher's callback as the dispatcher would and return the outcome."""
    completed: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
    s = runner.settings
    runner.dispatcher = SimpleNamespace(  # type: ignore[assignment]
        complete=lambda _msg, outcome: completed.set_result(outcome),
        # The policy's delay, as Dispatcher.retry_delay gives it (the worker logs it).
        retry_delay=lambda attempts: policy_retry_delay(
            attempts, s.retry_delay, s.retry_multiplier, s.max_retry_delay
        ),
        max_attempts=runner.spec.max_attempts or s.max_attempts,
    )
    result = runner.callback(msg)
    if result is DEFERRED:  # a sync handler: the pool reports through complete()
        return await completed
    if inspect.isawaitable(result):
        return await result  # type: ignore[no-any-return]
    return result  # type: ignore[no-any-return]


def raising(exc: BaseException) -> Any:
    def handle(msg: Message) -> None:
        raise exc

    return handle


def async_raising(exc: BaseException) -> Any:
    async def handle(msg: Message) -> None:
        raise exc

    return handle


@pytest.mark.parametrize("make", [raising, async_raising], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (None, "finished"),
        (Retry(2), "retry in 2s"),
        (KeyError("k"), "retry"),
        (Reject("bad"), "rejected"),
        (asyncio.CancelledError(), "retry in 0s"),
    ],
)
async def test_callback_maps_each_outcome(
    make: Any, exc: BaseException | None, expected: str
) -> None:
    func = make(exc) if exc is not None else (sync_handler if make is raising else handler)
    runner = runner_for(func)
    msg, owner = make_message()
    outcome = await run_callback(runner, msg)
    if expected == "retry":  # the worker picks the policy's (jittered) delay, to log it
        assert isinstance(outcome, Retry) and outcome.delay is not None and outcome.delay > 0
    else:
        assert describe_outcome(outcome) == expected
    if isinstance(outcome, Retry):
        assert outcome.backoff is not isinstance(exc, asyncio.CancelledError)
    assert owner.settled == []  # the consumer sends the outcome, not the callback
    assert sum(runner.counts) == 1  # one duration recorded
    if runner.pool is not None:
        runner.pool.shutdown()


@pytest.mark.parametrize("is_async", [False, True])
async def test_callback_after_answering_itself_sends_nothing_more(is_async: bool) -> None:
    def answer_then_raise(msg: Message) -> None:
        msg.finish()
        raise RuntimeError("after")

    async def answer_then_raise_async(msg: Message) -> None:
        answer_then_raise(msg)

    def answer_twice(msg: Message) -> None:
        msg.finish()
        msg.finish()

    for func in (answer_then_raise_async if is_async else answer_then_raise, answer_twice):
        if is_async and func is answer_twice:
            continue
        runner = runner_for(func)
        msg, owner = make_message()
        assert await run_callback(runner, msg) is None
        await asyncio.sleep(0.01)  # a sync handler's FIN is handed to the loop thread
        assert owner.settled == [FINISH]
        if runner.pool is not None:
            runner.pool.shutdown()


async def test_sync_handler_runs_off_the_loop_and_answers_its_owner() -> None:
    """The handler's own answer reaches the message's owner from the handler's thread;
    the dispatcher (the owner in a worker) hands it to the loop: tests/contract."""
    seen: list[int] = []

    def handle(msg: Message) -> None:
        seen.append(threading.get_ident())
        msg.touch()
        msg.retry(1.0)

    runner = runner_for(handle)
    msg, owner = make_message()
    assert await run_callback(runner, msg) is None
    await asyncio.sleep(0.01)
    loop_thread = threading.get_ident()
    assert seen and seen[0] != loop_thread
    assert owner.threads == seen and owner.touched == 1
    assert isinstance(owner.settled[0], Retry) and owner.settled[0].delay == 1.0
    assert runner.pool is not None
    runner.pool.shutdown()


def collect(runner: _TaskRunner) -> list[Outcome | None]:
    """Outcomes the runner reports to its dispatcher, in order."""
    outcomes: list[Outcome | None] = []
    runner.dispatcher = SimpleNamespace(  # type: ignore[assignment]
        complete=lambda _msg, outcome: outcomes.append(outcome)
    )
    return outcomes


async def wait_for_count(items: list[Any], count: int, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while len(items) < count:
            await asyncio.sleep(0.005)


async def test_sync_pool_grows_when_its_threads_block_up_to_max_in_flight() -> None:
    release = threading.Event()

    def block(msg: Message) -> None:
        release.wait(5)

    runner = runner_for(block, max_in_flight=3)
    outcomes = collect(runner)
    assert all(runner.callback(make_message()[0]) is DEFERRED for _ in range(5))
    assert runner.pool is not None
    await asyncio.sleep(0)  # the batch is handed over at the end of the iteration
    assert runner.pool.started() == 1  # lazily: one to start with
    # Every thread blocked and jobs waiting: the pool grows, doubling per check.
    async with asyncio.timeout(2):
        while runner.pool.started() < 3:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert runner.pool.started() == 3  # never past max_in_flight
    release.set()
    await wait_for_count(outcomes, 5)
    assert outcomes == [FINISH] * 5
    runner.pool.shutdown()


async def test_sync_pool_keeps_few_threads_for_fast_handlers() -> None:
    runner = runner_for(sync_handler, max_in_flight=50)
    outcomes = collect(runner)
    for round_ in range(1, 21):
        for _ in range(50):
            runner.callback(make_message()[0])
        await wait_for_count(outcomes, 50 * round_)
    assert outcomes == [FINISH] * 1000
    assert runner.pool is not None
    assert runner.pool.started() <= 3
    runner.pool.shutdown()


async def test_sync_handler_returning_a_coroutine_is_a_failure() -> None:
    def wrong(msg: Message) -> Any:
        return handler(msg)

    runner = runner_for(wrong)
    outcome = await run_callback(runner, make_message()[0])
    assert isinstance(outcome, Retry) and outcome.backoff  # a failure: the policy's delay
    assert runner.pool is not None
    runner.pool.shutdown()


def test_duration_histogram_buckets_span_1ms_to_1h() -> None:
    assert DURATION_BUCKETS[0] == 0.001 and DURATION_BUCKETS[-1] == 3600
    assert list(DURATION_BUCKETS) == sorted(DURATION_BUCKETS)


def test_dead_letter_envelope_text_and_binary() -> None:
    msg, _ = make_message(b'{"id": 1}', attempts=5)
    doc = json.loads(dead_letter_envelope(msg, "max attempts exceeded", "svc.task"))
    assert doc == {
        "topic": "t", "channel": "c", "id": "0123456789abcdef", "attempts": 5,
        "reason": "max attempts exceeded", "timestamp": 1_700_000_000_000_000_000,
        "task": "svc.task", "body": '{"id": 1}',
    }  # fmt: skip
    msg, _ = make_message(b"\xff\x00")
    doc = json.loads(dead_letter_envelope(msg, "r"))
    assert doc["body"] == "/wA=" and doc["body_encoding"] == "base64"


# --- load_registry ----------------------------------------------------------------------


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write modules of a fresh, uniquely named package; returns ``write(module, code)``."""
    name = f"nsqw_pkg_{uuid.uuid4().hex[:12]}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()

    def write(module: str, code: str) -> str:
        (root / f"{module}.py").write_text(textwrap.dedent(code))
        return f"{name}.{module}"

    yield write
    for mod in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[mod]


TASKS = """
    from nsqworker.task import task

    @task("{topic}", channel="a")
    async def first(msg):
        pass

    @task("{topic}", channel="b")
    def second(msg):
        pass
"""


def test_load_registry_returns_only_the_tasks_of_that_import(package: Any) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    one = package("one", TASKS.format(topic=topic))
    two = package("two", TASKS.format(topic=topic + "x"))
    reg = load_registry(one)
    assert [s.name for s in reg] == [f"{one}.first", f"{one}.second"]
    assert [s.module for s in load_registry(two)] == [two, two]
    assert [s.name for s in load_registry(one)] == [f"{one}.first", f"{one}.second"]  # again


def test_load_registry_follows_imports_of_other_modules(package: Any) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    handlers = package("handlers", TASKS.format(topic=topic))
    entry = package("entry", f"import {handlers}\n")
    assert len(load_registry(entry)) == 2


def test_load_registry_attribute(package: Any) -> None:
    target = package("custom", """
        from nsqworker.task import Registry
        tasks = Registry()
        other = 42
        empty = Registry()

        @tasks.task("x", channel="c")
        def handle(msg):
            pass
    """)  # fmt: skip
    assert len(load_registry(f"{target}:tasks")) == 1
    with pytest.raises(TaskImportError, match="has no attribute 'nope'"):
        load_registry(f"{target}:nope")
    with pytest.raises(TaskImportError, match="is a int, not an nsqworker Registry"):
        load_registry(f"{target}:other")
    with pytest.raises(TaskImportError, match="holds no tasks"):
        load_registry(f"{target}:empty")


def test_load_registry_errors_carry_the_traceback(package: Any) -> None:
    broken = package("broken", "x = 1\nraise RuntimeError('config missing')\n")
    with pytest.raises(TaskImportError) as info:
        load_registry(broken)
    err = info.value
    assert isinstance(err, ImportError) and err.module == broken
    assert "importing" in str(err) and "RuntimeError: config missing" in str(err)
    assert "Traceback" in err.traceback_text and "config missing" in err.traceback_text

    missing_dep = package("needs", "import nsqw_no_such_dependency\n")
    with pytest.raises(TaskImportError, match="No module named 'nsqw_no_such_dependency'"):
        load_registry(missing_dep)

    bad_task = package(
        "badtask", "from nsqworker.task import task\ntask('bad name', channel='c')\n"
    )
    with pytest.raises(TaskImportError, match="invalid topic name 'bad name'"):
        load_registry(bad_task)


def test_load_registry_missing_module_and_no_tasks(package: Any) -> None:
    with pytest.raises(
        TaskImportError, match=r"no module named 'nsqw_nope_x': run from .*PYTHONPATH"
    ):
        load_registry("nsqw_nope_x.tasks")
    package_name = package("present", "X = 1\n").rpartition(".")[0]
    with pytest.raises(TaskImportError, match=f"package {package_name} .* has no module 'absent'"):
        load_registry(f"{package_name}.absent")
    with pytest.raises(TaskImportError, match="not a module path"):
        load_registry("myservice/tasks.py")
    empty = package("empty", "X = 1\n")
    with pytest.raises(TaskImportError, match="declares no tasks"):
        load_registry(empty)


def test_the_old_option_name_requeue_delay_works_with_one_deprecation_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = Registry()
    with caplog.at_level("WARNING", logger="nsqworker.task"):

        @reg.task("clicks", channel="c", requeue_delay=3)
        def handle(msg: Message) -> None: ...

    assert handle.spec.retry_delay == 3.0
    assert handle.spec.requeue_delay == 3.0  # the old attribute reads the new one
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert lines == ["@task('clicks', channel='c'): requeue_delay is deprecated; use retry_delay"]
    with pytest.raises(TaskDefinitionError, match="requeue_delay is the old name of retry_delay"):
        reg.task("clicks", channel="d", requeue_delay=1, retry_delay=2)
