"""``@spark_task``: a task whose handler describes a Spark job that the worker runs.

The handler returns a :class:`~nsqworker.spark.job.SparkJob`. The task then:

1. checks it (:func:`~nsqworker.spark.job.job_problems`) and, when the job says how long
   it may run, that the transport holds a delivery that long (``Message.max_hold``: on
   NSQ nsqd's ``--max-msg-timeout``); a job that cannot
   run is a dead letter (``Reject``) before anything is submitted;
2. submits it to the runner ``Settings.spark_runner`` names and waits for its end,
   while the worker keeps the message alive (TOUCH on NSQ);
3. returns on success (FIN) or raises :class:`~nsqworker.spark.job.SparkJobFailed`
   (REQ with backoff, dead letter after ``max_attempts``).

A job running past ``SparkJob.timeout`` is stopped (``runner.cancel``) and the attempt
fails like a failed job. At the task's own time limit (``@spark_task(timeout=...)``) the
job is stopped on every runner and the message retried.

When the worker stops, a job of a detached runner (Kubernetes) is left running and
its message requeued at once: the redelivery adopts the job. A local job keeps running
for ``drain_timeout``; then the worker cancels the handler, which stops the job's
process group, and the message is requeued.
"""

from __future__ import annotations

import asyncio
import functools
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from nsqworker.hooks import call
from nsqworker.logging import get_logger
from nsqworker.message import Message
from nsqworker.outcomes import TIME_LIMIT
from nsqworker.spark.job import (
    JobContext,
    JobResult,
    JobState,
    SparkJob,
    SparkJobFailed,
    job_problems,
)
from nsqworker.spark.policy import DEFAULT_APP_URIS
from nsqworker.spark.runner import Runner, runner_for
from nsqworker.task import Registry, Reject, TaskFunction, default_registry

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["run_spark_job", "spark_task"]

log = get_logger("nsqworker.spark")

JobBuilder = Callable[[Message], SparkJob | Awaitable[SparkJob]]
#: ``on_success(msg, job, result)``: a plain function (run in a thread) or ``async def``.
SuccessHook = Callable[[Message, SparkJob, JobResult], Any]


def spark_task(
    topic: str,
    *,
    channel: str,
    registry: Registry | None = None,
    on_success: SuccessHook | None = None,
    **options: Any,
) -> Callable[[JobBuilder], TaskFunction[[Message], Awaitable[None]]]:
    """Declare a task whose handler returns the :class:`SparkJob` to run for a message.

    Takes every :meth:`nsqworker.Registry.task` option (``max_in_flight`` is how many
    jobs of this task run at once in a worker process), ``registry`` (default: the
    one ``@task`` uses) and ``on_success(msg, job, result)``, called after the job
    succeeded and before the FIN (to publish what it produced; if it raises, the
    message is requeued and the job runs again, so keep jobs idempotent). The handler
    may be ``def`` or ``async def``; a plain one runs in a thread, since it may read
    files or call services to describe the job.
    """
    if on_success is not None and not callable(on_success):
        raise TypeError(f"on_success must be a function (msg, job, result), got {on_success!r}")
    target = default_registry if registry is None else registry

    def decorate(func: JobBuilder) -> TaskFunction[[Message], Awaitable[None]]:
        settings_cache: list[Settings] = []

        @functools.wraps(func)
        async def handler(msg: Message) -> None:
            # Called outside a Worker (a test, a script): settings from the environment.
            if not settings_cache:
                from nsqworker.settings import Settings

                settings_cache.append(Settings.load())
            runner = runner_for(settings_cache[0])
            await run_spark_job(func, msg, runner, _task_name(handler), on_success)

        def bind_settings(settings: Settings) -> Callable[[Message], Awaitable[None]]:
            """The handler with the runner of the worker's ``settings`` (the Worker calls
            this once per task it starts)."""
            runner = runner_for(settings)
            name = _task_name(handler)

            @functools.wraps(func)
            async def bound(msg: Message) -> None:
                await run_spark_job(func, msg, runner, name, on_success)

            return bound

        handler.bind_settings = bind_settings  # type: ignore[attr-defined]
        return target.task(topic, channel=channel, **options)(handler)

    return decorate


def _task_name(handler: Callable[..., Any]) -> str:
    spec = getattr(handler, "spec", None)
    return spec.name if spec is not None else getattr(handler, "__qualname__", "spark")


async def run_spark_job(
    func: JobBuilder, msg: Message, runner: Runner, task: str, on_success: SuccessHook | None = None
) -> None:
    """Describe, check, submit and wait for the job of ``msg``; see the module doc."""
    job: Any = await call(func, msg)  # async (callable objects too) on the loop, else a thread
    problems = job_problems(
        job, runner.kind, roots=getattr(runner, "app_roots", ()),
        app_uris=getattr(runner, "app_uris", DEFAULT_APP_URIS),
    )  # fmt: skip
    if problems:
        raise Reject("invalid SparkJob: " + "; ".join(problems))
    assert isinstance(job, SparkJob)
    limit = msg.max_hold  # the transport's longest hold of a delivery (None: no limit)
    if job.timeout is not None and limit is not None and job.timeout > limit:
        raise Reject(
            f"SparkJob timeout {job.timeout:g}s is longer than the broker holds a delivery "
            f"({limit:g}s; on NSQ, nsqd's --max-msg-timeout): it would deliver the message "
            "again while the job runs and the job would run twice; raise that limit "
            "(docs/spark.md) or split the job"
        )
    ctx = JobContext(msg.topic, msg.channel, msg.id, msg.attempts, task)
    span = trace.get_current_span()
    handle = await runner.submit(job, ctx)
    result = await _wait_for_job(runner, handle, job, msg, task)
    if result is None:  # the worker stops: a detached job was left running
        return
    _record(span, runner, result)
    if result.state is not JobState.SUCCEEDED:
        raise SparkJobFailed(result)
    log.info(
        "spark job succeeded", id=msg.id, task=task, job_id=result.job_id,
        duration_ms=round(result.duration * 1000, 1),
    )  # fmt: skip
    if on_success is not None:
        await call(on_success, msg, job, result)


async def _wait_for_job(
    runner: Runner, handle: Any, job: SparkJob, msg: Message, task: str
) -> JobResult | None:
    """The job's result; None when the worker stops and a detached job is left running
    (the message requeued at once). Past ``job.timeout`` the job is stopped and a
    FAILED result naming the limit returned; at the task's time limit it is stopped on
    every runner, and on a stop only a child job (local runner) is."""
    draining = msg.draining if runner.detached else None
    waiting = asyncio.ensure_future(runner.wait(handle))
    stop = asyncio.ensure_future(draining.wait()) if draining is not None else None
    started = time.monotonic()
    try:
        pending = {waiting} if stop is None else {waiting, stop}
        done, _ = await asyncio.wait(pending, timeout=job.timeout, return_when=FIRST_COMPLETED)
        if waiting in done:
            return waiting.result()
        waiting.cancel()
        if stop is not None and stop in done:
            log.info(
                "worker stopping: Spark job left running, message requeued",
                id=msg.id, task=task, runner=runner.kind,
            )  # fmt: skip
            msg.retry(0, backoff=False)
            return None
        assert job.timeout is not None
        log.warning(
            "ran past its SparkJob timeout: stopping the Spark job",
            id=msg.id, task=task, timeout=job.timeout,
        )  # fmt: skip
        await runner.cancel(handle)
        error = f"ran past its SparkJob timeout of {job.timeout:g}s and was stopped"
        return JobResult(JobState.FAILED, handle.job_id, time.monotonic() - started, error=error)
    except asyncio.CancelledError as exc:
        waiting.cancel()
        if exc.args == (TIME_LIMIT,):
            log.warning("ran past its time limit: stopping the Spark job", id=msg.id, task=task)
            await runner.cancel(handle)
        elif not runner.detached:
            log.info("worker stopping: stopping the Spark job", id=msg.id, task=task)
            await runner.cancel(handle)
        raise
    finally:
        if stop is not None:
            stop.cancel()


def _record(span: trace.Span, runner: Runner, result: JobResult) -> None:
    if not span.is_recording():
        return
    span.set_attribute("spark.runner", runner.kind)
    span.set_attribute("spark.job_id", result.job_id)
    span.set_attribute("spark.state", result.state.value)
    span.set_attribute("spark.duration_s", round(result.duration, 3))
    if result.exit_code is not None:
        span.set_attribute("spark.exit_code", result.exit_code)
    if result.error:
        span.set_attribute("spark.error", result.error[-1000:])
