"""nsqworker: run Python task handlers on NSQ, NATS JetStream or RabbitMQ Streams.

Mark functions with ``@task("topic", channel=...)`` and run them with
``nsqworker run myservice.tasks``; publish with :class:`Producer` or
:class:`SyncProducer` (NSQ), or the producer :func:`producer_for` gives for any transport.
"""

from typing import TYPE_CHECKING, Any

from nsqworker._version import __version__
from nsqworker.errors import (
    AlreadyResponded,
    AuthError,
    ConfigurationError,
    ConnectionClosed,
    InvalidName,
    MessageTooLarge,
    NoConnection,
    NSQDError,
    NSQWorkerError,
    PublishError,
    UndecodableBody,
)
from nsqworker.hooks import AfterHook, BeforeHook, DeadLetterHook, ErrorHook
from nsqworker.message import Message, Outcome
from nsqworker.task import (  # eager: `task` must not resolve to the submodule nsqworker.task
    Publish,
    Registry,
    Reject,
    Retry,
    TaskDefinitionError,
    TaskImportError,
    TaskSpec,
    TaskTimeout,
    default_registry,
    load_registry,
    task,
)

if TYPE_CHECKING:
    from nsqworker.nsq.producer import Producer
    from nsqworker.nsq.sync_producer import SyncProducer
    from nsqworker.producing import producer_for
    from nsqworker.settings import Settings, SettingsError
    from nsqworker.worker import Worker

# The rest of the public surface is imported on first use, so that `import nsqworker`
# (and with it `nsqworker --version`) does not pay for pydantic, structlog and httpx.
_LAZY = {
    "Producer": "nsqworker.nsq.producer",
    "SyncProducer": "nsqworker.nsq.sync_producer",
    "Settings": "nsqworker.settings",
    "SettingsError": "nsqworker.settings",
    "producer_for": "nsqworker.producing",
    "Worker": "nsqworker.worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nsqworker' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [  # noqa: RUF022 - grouped by theme, not sorted
    # tasks
    "Message",
    "Registry",
    "Publish",
    "Reject",
    "Retry",
    "TaskSpec",
    "TaskTimeout",
    "default_registry",
    "load_registry",
    "task",
    # hooks (for annotations)
    "AfterHook",
    "BeforeHook",
    "DeadLetterHook",
    "ErrorHook",
    "Outcome",
    # running
    "Settings",
    "Worker",
    # publishing
    "Producer",
    "SyncProducer",
    "producer_for",
    # errors
    "AlreadyResponded",
    "AuthError",
    "ConfigurationError",
    "ConnectionClosed",
    "InvalidName",
    "MessageTooLarge",
    "UndecodableBody",
    "NSQDError",
    "NSQWorkerError",
    "NoConnection",
    "PublishError",
    "SettingsError",
    "TaskDefinitionError",
    "TaskImportError",
    "__version__",
]
