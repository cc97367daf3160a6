"""A broker source or sink refuses an option it does not read, naming the closest one
it does (nsqworker/spark/streaming/options.py), while the options Spark adds itself
pass: at the level of the real classes, and once through a real Spark query."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from nsqworker.errors import ConfigurationError
from nsqworker.settings import Settings
from nsqworker.spark.streaming.jetstream import NatsSource
from nsqworker.spark.streaming.nsq_source import NsqSource
from nsqworker.spark.streaming.rabbitmq import RabbitStreamSource
from nsqworker.spark.streaming.sinks import BrokerStreamWriter
from tests.spark import session_cases as cases
from tests.spark.streaming_cases import driver_env

APP = Path(__file__).parent / "apps" / "option_typo.py"
SOURCES: dict[str, Any] = {
    "nsq": NsqSource,
    "nats": NatsSource,
    "rabbitmq-stream": RabbitStreamSource,
}
#: What Spark adds to the options a query sets (seen on pyspark 4.1: load(path),
#: start(path), checkpointLocation, queryName), in the lower case it passes them in.
FROM_SPARK = {"path": "/data/in", "checkpointlocation": "/ck", "queryname": "q"}


@pytest.fixture(autouse=True)
def no_worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("NSQWORKER_")]:
        monkeypatch.delenv(key)


def reader(fmt: str, **options: str) -> Any:
    """The stream reader Spark would get from the ``fmt`` source with ``options``."""
    return SOURCES[fmt](CaseInsensitiveDict(options)).streamReader(None)


@pytest.mark.parametrize(
    ("fmt", "options", "message"),
    [
        ("nsq", {"topic": "t", "chanel": "c"}, "nsq source: unknown option 'chanel'; did you "
         "mean 'channel'?"),
        ("nats", {"stream": "s", "maxRecordPerBatch": "5"}, "nats source: unknown option "
         "'maxrecordperbatch'; did you mean 'maxRecordsPerBatch'?"),
        ("rabbitmq-stream", {"stream": "s", "startingOffset": "latest"}, "rabbitmq-stream "
         "source: unknown option 'startingoffset'; did you mean 'startingOffsets'?"),
        ("nats", {"stream": "s", "colour": "red"}, "nats source: unknown option 'colour'; it "
         "reads stream, startingOffsets, maxRecordsPerBatch, numPartitions"),
    ],
)  # fmt: skip
def test_a_source_refuses_an_option_it_does_not_read(
    fmt: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        reader(fmt, **options)
    assert str(refused.value).startswith(message)


def test_only_what_is_not_read_is_refused() -> None:
    """Every documented option and every one Spark adds pass; a sink's misspelt one not."""
    common = {"startingOffsets": "latest", "maxRecordsPerBatch": "5", "numPartitions": "3"}
    nsq = reader("nsq", topic="t", channel="c", maxInFlight="7", **common, **FROM_SPARK)
    assert (nsq.options.topic, nsq.channel, nsq.hold) == ("t", "c", 7)
    nats = reader("nats", stream="s", **common, **FROM_SPARK)
    assert (nats.options.max_per_batch, nats.options.partitions) == (5, 3)
    rabbit = reader("rabbitmq-stream", topic="s", **common, **FROM_SPARK)
    assert rabbit.options.starting == "latest"
    settings = Settings()
    for fmt, target in (("nats", "subject"), ("nsq", "topic"), ("rabbitmq-stream", "stream")):
        options = CaseInsensitiveDict({target: "out", "producerName": "p", **FROM_SPARK})
        assert BrokerStreamWriter(fmt, options, settings).name == "p"
    with pytest.raises(ConfigurationError, match=r"nats sink: unknown option 'producer_name'; "
                       r"did you mean 'producerName'\?"):  # fmt: skip
        BrokerStreamWriter("nats", {"subject": "s", "producer_name": "p"}, settings)
    # the nats sink publishes to a subject: a topic would be ignored, so it is refused
    with pytest.raises(ConfigurationError, match="nats sink: unknown option 'topic'"):
        BrokerStreamWriter("nats", {"subject": "s", "topic": "t"}, settings)
    with pytest.raises(ConfigurationError, match=r"'password'.*environment"):
        BrokerStreamWriter("nsq", {"topic": "t", "password": "hunter2"}, settings)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_query_ends_with_the_error_naming_the_option(tmp_path: Path) -> None:
    cases.need_java()
    done = subprocess.run(
        [sys.executable, str(APP), str(tmp_path)], capture_output=True, text=True,
        timeout=240, env=driver_env({}), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert (
        "nats source: unknown option 'maxrecordperbatch'; did you mean 'maxRecordsPerBatch'?"
        in lines["source"]
    ), lines["source"][-2000:]
    assert (
        "nats sink: unknown option 'producernmae'; did you mean 'producerName'?" in lines["sink"]
    ), lines["sink"][-2000:]
