"""What both forms of the task share: where reports go and how they are announced.

- ``SPARK_PIPELINE_OUTPUT``: where reports go (default .run/spark_pipeline/reports).
"""

from __future__ import annotations

import os
from pathlib import Path

from nsqworker import Message, Producer

OUTPUT = os.environ.get(
    "SPARK_PIPELINE_OUTPUT",
    str(Path(__file__).resolve().parents[2] / ".run/spark_pipeline/reports"),
)
REPORTS_TOPIC = "reports_ready"

_producers: dict[str, Producer] = {}


def producer_for(msg: Message) -> Producer:
    """A producer to the nsqd ``msg`` came from (one per nsqd, kept)."""
    producer = _producers.get(msg.nsqd_address)
    if producer is None:
        producer = _producers[msg.nsqd_address] = Producer([msg.nsqd_address])
    return producer
