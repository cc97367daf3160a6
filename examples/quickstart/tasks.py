"""Two tasks to start from: one ``async def``, one plain ``def``.

Run them with ``nsqworker run examples.quickstart.tasks`` and publish with
``nsqworker publish quickstart '{"text": "hi"}'``; README.md has the whole walk-through.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from nsqworker import Message, task
from nsqworker.logging import get_logger

log = get_logger(__name__)


def text_of(msg: Message) -> str:
    """The ``text`` of a JSON object body, or the body itself as text."""
    try:
        data: Any = msg.json()
    except ValueError:  # not JSON (UndecodableBody), or not text
        return msg.body.decode("utf-8", "replace")
    if isinstance(data, dict) and "text" in data:
        return str(data["text"])
    return json.dumps(data)


def age_ms(msg: Message) -> float:
    """Milliseconds since nsqd accepted the message."""
    return round((time.time_ns() - msg.timestamp) / 1e6, 1)


@task("quickstart", channel="greeter")
async def greet(msg: Message) -> None:
    """An async handler runs on the worker's event loop: await, never block, here."""
    log.info(f"hello from the async task: {text_of(msg)!r}", age_ms=age_ms(msg))
    # Returning normally finishes the message (FIN); raising retries it (REQ).


@task("quickstart_sync", channel="counter", max_in_flight=4)
def count_words(msg: Message) -> None:
    """A plain function runs in a thread (up to max_in_flight at once): blocking is fine."""
    text = text_of(msg)
    time.sleep(0.2)  # stands for a blocking call: a database driver, requests, a subprocess
    words = len(text.split())
    thread = threading.current_thread().name
    log.info(f"{words} word(s) in {text!r}, counted in a thread", thread=thread)
