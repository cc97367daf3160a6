"""The settings of what runs beside the task layer (schedules, the console, handler
limits): one base of :class:`nsqworker.settings.Settings`, each owner's fields in its own
module."""

from __future__ import annotations

from nsqworker.console_settings import ConsoleSettings
from nsqworker.handler_limits import HandlerLimitSettings
from nsqworker.schedules.settings import ScheduleSettings

__all__ = ["FeatureSettings"]


class FeatureSettings(ScheduleSettings, ConsoleSettings, HandlerLimitSettings):
    """Schedules', the console's and handler limits' fields, listed before the brokers'."""
