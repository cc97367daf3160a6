"""nsqworker: run Python task handlers on NSQ topics.

Mark functions with ``@task("topic", channel=...)`` and run them with
``nsqworker run myservice.tasks``; publish with :class:`Producer` or
:class:`SyncProducer`.
"""

__version__ = "0.1.0"

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
from nsqworker.message import Message
from nsqworker.producer import Producer
from nsqworker.settings import Settings, SettingsError
from nsqworker.sync_producer import SyncProducer
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
