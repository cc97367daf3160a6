"""``@spark_session_task``: a task whose handler runs Spark jobs in a long-lived session.

::

    @spark_session_task("clicks", channel="sessionize", max_in_flight=2)
    def sessionize(msg: Message, spark: SparkSession) -> None:
        spark.read.json(msg.json()["input"]).groupBy("user").count().write.parquet(...)

The handler runs in a thread (its Spark calls block) with the process's session
(:mod:`nsqworker.spark.session`); its jobs carry the message's job group. Its result is
the task's: returning is a FIN; an exception, a job's failure included, is a REQ with
backoff and a dead letter after ``max_attempts``, with the Spark error's first lines in
the log and on the span. When the handler is cancelled (the task's ``timeout``, a drain
past ``drain_timeout``, a stopped worker), the message's jobs are cancelled and the
message is requeued.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from nsqworker.hooks import call, is_async_callable
from nsqworker.logging import get_logger
from nsqworker.message import Message
from nsqworker.spark.session import SessionHolder, error_summary, group_name, holder_for
from nsqworker.task import Registry, TaskFunction, default_registry

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from nsqworker.settings import Settings

__all__ = ["SessionHandler", "run_in_session", "spark_session_task"]

log = get_logger("nsqworker.spark")

#: ``def handler(msg, spark) -> result``, run in a thread.
SessionHandler = Callable[[Message, "SparkSession"], Any]
#: ``on_success(msg, result)``: a plain function (run in a thread) or ``async def``.
SuccessHook = Callable[[Message, Any], Any]
#: Seconds a cancelled handler's thread is waited for once its jobs were cancelled.
CANCEL_GRACE = 5.0


def spark_session_task(
    topic: str,
    *,
    channel: str,
    registry: Registry | None = None,
    on_success: SuccessHook | None = None,
    **options: Any,
) -> Callable[[SessionHandler], TaskFunction[[Message], Any]]:
    """Declare a task whose handler ``def f(msg, spark)`` runs Spark jobs in the worker
    process's SparkSession (a local driver, or Spark Connect with ``spark_remote``).

    Takes every :meth:`nsqworker.Registry.task` option (``max_in_flight``: how many
    messages' jobs run at once in the session; ``timeout``: seconds before the
    message's jobs are cancelled and it is retried) and ``registry`` (default: the one
    ``@task`` uses), and ``on_success(msg, result)``, called with what the handler
    returned before the FIN (a plain function runs in a thread, an ``async def`` on the
    loop: publish what the jobs produced there; if it raises, the message is retried).
    The handler must be a plain ``def``: it runs in a thread.
    """
    if on_success is not None and not callable(on_success):
        raise TypeError(f"on_success must be a function (msg, result), got {on_success!r}")
    target = default_registry if registry is None else registry

    def decorate(func: SessionHandler) -> TaskFunction[[Message], Any]:
        if is_async_callable(func) or not callable(func):
            raise TypeError(
                f"@spark_session_task needs a plain function def f(msg, spark), got {func!r}"
            )
        state: dict[str, Any] = {}

        @functools.wraps(func)
        async def handler(msg: Message) -> Any:
            # Called outside a Worker (a test, a script): settings from the environment.
            if "holder" not in state:
                from nsqworker.settings import Settings

                state["holder"] = holder_for(Settings.load())
            result = await run_in_session(func, msg, state["holder"], _task_name(handler))
            return await _succeeded(on_success, msg, result)

        def bind_settings(settings: Settings) -> Callable[[Message], Any]:
            """The handler on the session of the worker's ``settings`` (the Worker calls
            this once per task it starts, and ``close()`` once it has drained)."""
            holder = holder_for(settings)
            name = _task_name(handler)

            @functools.wraps(func)
            async def bound(msg: Message) -> Any:
                result = await run_in_session(func, msg, holder, name)
                return await _succeeded(on_success, msg, result)

            async def close() -> None:
                await asyncio.to_thread(holder.release)

            holder.acquire()

            bound.close = close  # type: ignore[attr-defined]
            if settings.spark_session_start == "worker_start":
                _start_early(holder)
            return bound

        # The Registry checks the signature the handler shows: (msg), not func's (msg, spark).
        del handler.__wrapped__
        handler.bind_settings = bind_settings  # type: ignore[attr-defined]
        handler.kind = "a Spark session task"  # type: ignore[attr-defined]
        return target.task(topic, channel=channel, **options)(handler)

    return decorate


async def _succeeded(on_success: SuccessHook | None, msg: Message, result: Any) -> Any:
    if on_success is not None:
        await call(on_success, msg, result)
    return result


def _task_name(handler: Callable[..., Any]) -> str:
    spec = getattr(handler, "spec", None)
    return spec.name if spec is not None else getattr(handler, "__qualname__", "spark")


def _start_early(holder: SessionHolder) -> None:
    def started(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and (exc := future.exception()) is not None:
            log.error("starting the spark session failed", error=error_summary(exc))

    # A thread, not the loop: a local driver takes seconds; the first message waits on
    # the holder's lock until it is up.
    asyncio.get_running_loop().run_in_executor(None, holder.get).add_done_callback(started)


async def run_in_session(
    func: SessionHandler, msg: Message, holder: SessionHolder, task: str
) -> Any:
    """Run ``func(msg, spark)`` in a thread under the message's job group; on
    cancellation, cancel the group's jobs, wait briefly for the thread, re-raise."""
    group = group_name(task, msg.id)
    description = f"{task} message {msg.id} attempt {msg.attempts}"
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("spark.backend", holder.backend)
        span.set_attribute("spark.job_group", group)

    def work() -> Any:
        spark = holder.get()
        holder.begin(spark, group, description)
        try:
            return func(msg, spark)
        finally:
            holder.end(spark, group)

    context = contextvars.copy_context()  # the message's span and log context
    thread = _executor().submit(context.run, work)
    running = asyncio.wrap_future(thread)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        log.info("cancelling the message's spark jobs", id=msg.id, task=task, group=group)
        await asyncio.to_thread(holder.cancel_group, group)
        done, _ = await asyncio.wait({running}, timeout=CANCEL_GRACE)
        if not done:
            log.warning("spark handler still running after its jobs were cancelled", group=group)
        else:
            holder.forget(group)
        raise
    except Exception as exc:
        summary = error_summary(exc)
        log.warning("spark job failed", id=msg.id, task=task, group=group, error=summary)
        if span.is_recording():
            span.set_attribute("spark.error", summary[:1000])
        raise


_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """The handlers' threads (their number bounds the session's FAIR pools; the
    tasks' ``max_in_flight`` bounds how many are busy)."""
    if not _pool:
        _pool.append(
            concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="nsqworker-spark")
        )
    return _pool[0]
