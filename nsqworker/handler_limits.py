"""Limits that keep a hostile message from costing a worker more than it is worth.

:class:`HandlerLimitSettings` is a base of :class:`nsqworker.settings.Settings`; its
fields are ordinary settings (``typed_body_max_bytes`` is
``NSQWORKER_TYPED_BODY_MAX_BYTES``). docs/tasks.md (Typed bodies, Time limits) says what
each one does.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["DEFAULT_TYPED_BODY_MAX_BYTES", "HandlerLimitSettings"]

DEFAULT_TYPED_BODY_MAX_BYTES = 1_048_576
"""1 MiB: nsqd's default --max-msg-size, so by default only a raised broker limit meets it."""


class HandlerLimitSettings(BaseSettings):
    """What a typed body and a handler past its time limit may cost (docs/tasks.md)."""

    typed_body_max_bytes: int = Field(
        DEFAULT_TYPED_BODY_MAX_BYTES,
        ge=0,
        le=2**31,
        description="Largest body (bytes) validated into a handler's typed parameter; a larger"
        " one is dead-lettered, its reason naming this setting; 0 = no cap. [0..2147483648]",
    )
    timeout_dead_letter_attempts: int = Field(
        0,
        ge=0,
        le=65535,
        description="A handler past its time limit on this delivery of its message or a later"
        " one dead-letters the message instead of retrying it (2: a message that times out on"
        " a retry is not tried again); 0 = retried like any failure. [0..65535]",
    )
