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


class RpcSettings(SettingsBase):
    """``@rpc`` endpoints' replies."""

    rpc_reply_addresses: ReplyAddresses = Field(
        default_factory=list, description="More nsqd (host:port patterns) @rpc may reply to."
    )
    rpc_reply_topics: ReplyPatterns = Field(
        default_factory=lambda: ["rpc_*", "rcp-*"],
        description="Topics (patterns) @rpc may reply to.",
    )
    rpc_error_details: bool = Field(
        False, description="RPC error replies carry any exception's type and text (not only ours)."
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("rpc_reply_addresses", "rpc_reply_topics", mode="before")
    @classmethod
    def _rpc_list(cls, value: Any) -> Any:
        return split_list(value)
