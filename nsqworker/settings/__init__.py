"""Settings: every tunable declared once, with its default, bounds and meaning, in the
section of the part that reads it.

Values come from, highest precedence first: keyword overrides (``Settings.load(**kw)`` or
``Settings(**kw)``), ``NSQWORKER_*`` environment variables, a config file (TOML, JSON or
dotenv), then the defaults. Durations are float seconds. List fields take a JSON list or
a comma-separated string in the environment. Anything unknown or invalid raises
``SettingsError``, one line per problem, each naming the field and where its value came
from: the argument (``Settings(workers=...)``, or the command-line flag when the CLI says
so), the environment variable, or the config file.

One module per owner, each a section with that owner's fields only:

==================  ===================================================================
``core``            which broker, client id, dialling and reconnecting, TLS files, tracing
``nsq``             nsqd and nsqlookupd, IDENTIFY, TLS and AUTH (with core's)
``nats``            NATS JetStream (with core's)
``streams``         RabbitMQ Streams (with core's)
``worker``          the task layer's defaults, worker processes, health, logs, limits
``rpc``             ``@rpc`` replies
``spark``           ``@spark_task`` and ``@spark_session_task``
``console``         ``nsqworker console``
``schedules``       periodic tasks' leader election
==================  ===================================================================

``base`` reads and shows values, ``problems`` says where a bad one came from, ``files``
reads config files, ``values`` checks addresses and lists. A transport takes its own
section (``NsqTransport(settings: NsqSettings)``), never the whole :class:`Settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nsqworker.settings.console import ConsoleSettings
from nsqworker.settings.core import CoreSettings
from nsqworker.settings.files import ENV_PREFIX, RESERVED_ENV_VARS
from nsqworker.settings.nats import NatsSettings
from nsqworker.settings.nsq import NsqSettings
from nsqworker.settings.problems import SettingsError
from nsqworker.settings.rpc import RpcSettings
from nsqworker.settings.schedules import ScheduleSettings
from nsqworker.settings.spark import SparkSettings
from nsqworker.settings.streams import StreamSettings
from nsqworker.settings.worker import WorkerSettings

__all__ = [
    "ENV_PREFIX",
    "RESERVED_ENV_VARS",
    "ConsoleSettings",
    "CoreSettings",
    "NatsSettings",
    "NsqSettings",
    "RpcSettings",
    "ScheduleSettings",
    "Settings",
    "SettingsError",
    "SparkSettings",
    "StreamSettings",
    "WorkerSettings",
]


class Settings(
    ScheduleSettings,
    ConsoleSettings,
    StreamSettings,
    NatsSettings,
    SparkSettings,
    RpcSettings,
    WorkerSettings,
    NsqSettings,
):
    """nsqworker's settings, every section's fields; see the module docstring for where
    values come from. ``nsqworker settings`` and :meth:`describe` list them core first,
    then NSQ's, the worker's, RPC's, Spark's, NATS', RabbitMQ Streams', the console's and
    the schedules'."""

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...
