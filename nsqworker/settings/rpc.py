"""The RPC section: where ``@rpc`` endpoints may reply, and what their error replies say
(:mod:`nsqworker.rpc`, docs/rpc.md, docs/security.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Field, field_validator
from pydantic_settings import NoDecode

from nsqworker.settings.base import SettingsBase
from nsqworker.settings.values import ReplyAddresses, reply_pattern, split_list

__all__ = ["RpcSettings"]

ReplyPatterns = Annotated[list[Annotated[str, AfterValidator(reply_pattern)]], NoDecode]


def reply_subject_pattern(text: str) -> str:
    """Check a NATS reply subject pattern: dot-separated tokens, ``*`` one token, ``>``
    the rest (last only), never a ``$`` subject (the server's own API)."""
    text = text.strip()
    tokens = text.split(".")
    if not text or any(c.isspace() for c in text) or "" in tokens:
        raise ValueError(f"{text!r} is not a NATS subject pattern like _INBOX.>")
    if any(("*" in t and t != "*") or (">" in t and t != ">") for t in tokens) or (
        ">" in tokens[:-1]
    ):
        raise ValueError(f"{text!r}: * and > are whole tokens, and > comes last (_INBOX.>)")
    if text.startswith("$"):
        raise ValueError(f"{text!r}: replies never go to $ subjects (the server's API)")
    return text


ReplySubjects = Annotated[list[Annotated[str, AfterValidator(reply_subject_pattern)]], NoDecode]


class RpcSettings(SettingsBase):
    """``@rpc`` endpoints' replies."""

    rpc_reply_addresses: ReplyAddresses = Field(
        default_factory=list, description="More nsqd (host:port patterns) @rpc may reply to."
    )
    rpc_reply_topics: ReplyPatterns = Field(
        default_factory=lambda: ["rpc_*", "rcp-*"],
        description="Topics (patterns) @rpc may reply to.",
    )
    rpc_reply_subjects: ReplySubjects = Field(
        default_factory=lambda: ["_INBOX.>"],
        description="NATS reply subjects (patterns: * a token, > the rest) @rpc may answer on.",
    )
    rpc_error_details: bool = Field(
        False, description="RPC error replies carry any exception's type and text (not only ours)."
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("rpc_reply_addresses", "rpc_reply_topics", "rpc_reply_subjects", mode="before")
    @classmethod
    def _rpc_list(cls, value: Any) -> Any:
        return split_list(value)
