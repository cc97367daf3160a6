"""nsqworker: run Python task handlers on NSQ topics.

Mark functions with ``@task("topic", channel=...)`` and run them with
``nsqworker run myservice.tasks``; publish with :class:`Producer` or
:class:`SyncProducer`.
"""

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
)
from nsqworker.nsq import publishing as _publishing
from nsqworker.nsq.message import Message
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.sync_producer import SyncProducer
from nsqworker.settings import Settings, SettingsError
from nsqworker.task import (
    Registry,
    Reject,
    Retry,
    TaskDefinitionError,
    TaskImportError,
    TaskSpec,
    default_registry,
    load_registry,
    task,
)
from nsqworker.worker import Worker


def _producer_instrumentation(envelope: bool) -> _publishing.Instrumentation:
    # Imported on the first Producer, not with the package: the SDK costs ~0.3 s.
    from nsqworker.telemetry.tracing import producer_instrumentation

    return producer_instrumentation(envelope=envelope)


_publishing.set_instrumentation_factory(_producer_instrumentation)

__all__ = [  # noqa: RUF022 - grouped by theme, not sorted
    # tasks
    "Message",
    "Registry",
    "Reject",
    "Retry",
    "TaskSpec",
    "default_registry",
    "load_registry",
    "task",
    # running
    "Settings",
    "Worker",
    # publishing
    "Producer",
    "SyncProducer",
    # errors
    "AlreadyResponded",
    "AuthError",
    "ConfigurationError",
    "ConnectionClosed",
    "InvalidName",
    "MessageTooLarge",
    "NSQDError",
    "NSQWorkerError",
    "NoConnection",
    "PublishError",
    "SettingsError",
    "TaskDefinitionError",
    "TaskImportError",
    "__version__",
]
