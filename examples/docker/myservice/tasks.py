"""The tasks of the example service: ``nsqworker run myservice.tasks``."""

from __future__ import annotations

from nsqworker import Message, task
from nsqworker.logging import get_logger

log = get_logger(__name__)


@task("clicks", channel="archive")
async def archive(msg: Message) -> None:
    """Log each click; returning normally FINs the message."""
    log.info("click", id=msg.id, body=msg.body.decode("utf-8", "replace"))
