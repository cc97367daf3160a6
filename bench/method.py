"""The "Method" part of docs/benchmarks.md, filled in with the run's sizes."""

from __future__ import annotations

from bench.config import Config

METHOD = """\
## Method

`make bench` (`python -m bench`) starts one nsqd v1.3.0 for the run on 127.0.0.1
(free ports, `--mem-queue-size={mem_queue}` so every queued message stays in memory),
runs the cases below and stops every process it started. Each client runs in its own
process, started fresh for each run, so no client's garbage, threads or imports
weigh on another's; our clients use {loop}, pynsq uses tornado's default asyncio loop.
Every topic is fresh and deleted afterwards. Sizes below are this run's (`--quick`
runs everything once with smaller sizes). The machine has two cores, and nsqd shares
them with the client it serves (and with every other process on the machine): a
client that makes nsqd work harder, or a second worker process, takes CPU from the
same two cores.

**Out of the box.** What a user runs: `nsqworker run bench_tasks` as a subprocess
(supervisor + 1 worker process, then `--workers 2`), default settings (nothing set but
`NSQWORKER_NSQD_TCP_ADDRESSES` and a free `NSQWORKER_HEALTH_PORT`, so `/metrics` is
served), stderr to a file (JSON logs, since it is not a terminal), the OpenTelemetry
SDK installed and not configured. The task module holds one `async def` no-op task
with `max_in_flight={mif}`. The command is started on a fresh topic; once `/readyz`
answers 200 and a second passed, the idle RSS of the supervisor and its children is
summed; the channel is paused, {count:,} messages (plus the Consume headroom) are
queued, the channel is unpaused. The clock starts when the first handler call in any
worker process sees its first message and stops when nsqd's channel stats show
{count:,} messages finished (looked at every 3 ms near the end, less often before); SIGTERM must then end the command with
exit code 0, and every log line must be one JSON object. pynsq's `Reader` with its
defaults (and `max_in_flight={mif}`, as Consume (d)) drains the same count from the
same nsqd, interleaved with these runs, and so does Go's `bench_reader` (the limit, run
as in Consume): "vs limit" here is to the `bench_reader` of the same runs, and the
"in every run" target compares run i with run i, so its worst run decides. This table has
{outofbox_runs} runs of each (its ratio to pynsq is the headline, and each side's rate
varies by up to a fifth from run to run here).

**Consume.** {count:,} messages of 100 bytes (and 5% + 2 x max_in_flight more, so the
queue never runs dry while the clock runs) are pre-loaded into a fresh topic and
channel (MPUB of 1,000 over TCP) before the client starts; max_in_flight {mif}. A
client's rate is timed from the first message its handler sees to the {count:,}th
(connect, IDENTIFY and SUB left out), so it is the steady drain rate. (Timing a queue
to empty would add nsqd's output-buffer flush timer, up to 250 ms, to the last
message.)
The handlers only count (`next()` on an `itertools.count`, the same in every client):
(a) the full `@task` path through `Worker` with an `async def` no-op handler and
(b) with a plain `def` no-op handler (run in the worker's thread pool), tracing off
(no OpenTelemetry SDK installed), logs at warning; (c) the raw `Consumer` with a
callback returning `FINISH`; (d) pynsq 0.9.1's `Reader`, `message_handler` returning
True. (e) NSQ's Go `bench_reader` is the limit: it opens one connection per CPU with
RDY = {mif} / connections and counts messages for a fixed `--runfor`, chosen to drain
about half of the queue; a run where it emptied the queue is discarded and redone
shorter. The CPU column (consume and publish) is the client process's CPU time, all
threads, over its timed window: near 100% means the client itself was the bottleneck.

**Publish.** Each client publishes 100-byte bodies for {publish_s:g} s (after 0.2 s of
warm-up) on one connection and counts what nsqd acknowledged: PUB awaited one at a
time; {batch:,} publishes at once (`asyncio.gather` of `publish()` for ours, which sends
the calls made while others are in flight as one MPUB per loop turn; for pynsq's
`Writer`, {batch:,} `pub()` calls with callbacks, a PUB each), the next {batch:,} once all
were acknowledged, with as many PUBs written at once on a bare socket as their limit
(nsqd answers each PUB with a write of its own); MPUB of
{mpub} awaited one at a time; and (ours only) MPUBs of {mpub} with up to 4 outstanding
on the one connection (`asyncio.gather` of 4 `publish_many`, then the next 4). NSQ's
Go `bench_writer` runs with `GOMAXPROCS=1`, hence one connection, one MPUB at a time
(it waits for each before the next); its MPUB of {mpub} is the reference of both MPUB
rows, and with a batch of 1 it is the Go reference for one-at-a-time publishing.

**Latency.** A publisher process sends PUBs at a fixed rate ({rates}) for
{latency_s:g} s, each body starting with the send time (`time.time_ns()`), on a bare
pipelined connection so it never limits the rate. A Worker process (async `@task`)
computes `time.time_ns() - sent` in the handler. The first 10% of messages are left
out. nsqd buffers writes to consumers (flush at `output_buffer_size` bytes or every
`output_buffer_timeout`). nsqworker's default (`output_buffer_size` unset) reads each
nsqd unbuffered and moves to a second, buffered connection only under load
(docs/consumer.md), and the target is checked on it; the `nsqd's batching` rows show
what nsqd's own defaults (16 KiB, 250 ms) cost at low rates. The in-process consume
cases run every client at nsqd's batching, as pynsq and bench_reader do; the Out of
the box table runs the default.

**Memory.** VmRSS from `/proc/<pid>/status` of a Worker process with {idle} async
tasks, each subscribed to its own topic, no traffic, one second after all subscribed.
Peak RSS under load is each consume process's own VmHWM at its end.

**Scale.** One Worker with {tasks} async no-op tasks (max_in_flight {tasks_mif} each),
one topic each, pre-loaded with {per_task:,} messages each: time from
`Worker.start()` until every task is subscribed; the rate over all tasks; the slowest
task's own rate (its messages over the time its last arrived) relative to the median
task's. Then {nsqd} more nsqd, each pre-loaded with {per_nsqd:,} messages, and one task
with max_in_flight {nsqd_mif} over all of them (RDY has to rotate): time from
`Worker.start()` until all are drained, and the smallest share of the messages handled
that came from one nsqd when half of them were handled (fair is 1/{nsqd}).

**Hot-path CPU.** Not a network benchmark: {cpu_count:,} pre-encoded message frames are
handed to `Connection.data_received` in 256 KiB chunks and the writes go to a
transport that drops them, so it measures only the client's own CPU per message.
`floor` is the least any client must do (decode, call the handler, one write of FINs
per read); the ratio column shows each path's speed relative to it.
`python -m bench.profile --path consumer --profiler cprofile` shows where it goes.

**Telemetry.** Two measures. (1) In one process, `bench/bench_telemetry.py` as it
is: microseconds per message of what the worker does around a handler
(`TaskInstrumentation.start`, the span's Context attached in the message's own copy
of the Context, `end` with FIN), best of 20 passes of 5,000, with no OpenTelemetry SDK, with 1% and with 100%
sampling, beside a bare SDK span (`start_span` + `end`, the process span's 11
attributes plus `messaging.nsq.outcome`), the same with a `fin` event, and
`start_as_current_span` + the event as a hand-written wrapper would make it. The
"minus" rows (what the framework adds around the SDK) are measured again with a span
processor that drops each span as it ends and no BatchSpanProcessor thread running
(that thread competes for the GIL and moves single passes by more than the
difference), as the median of 20 paired differences (the 100% pass right before the
bare one). (2) Through nsqd: the async no-op `@task`
Worker (as in Consume, at nsqd's batching) drains {telemetry_count:,} messages with no
SDK; with an SDK `TracerProvider` sampling 1% (`ParentBased(TraceIdRatioBased(0.01))`)
and every message (the default sampler), a `BatchSpanProcessor` and an exporter that
drops; and untraced, with a handler that makes one bare SDK span with the same
attributes, each case {telemetry_runs} times interleaved. Cost per message is
`1e6 / rate - 1e6 / rate with no SDK`, from each case's fastest run (as in (1): the
machine's other load only ever slows a run, and a difference of two single runs
carries the noise of both; the run-by-run figures are in the rows' notes); the fully
sampled cost minus the bare span's is what the framework adds around the SDK.

**Handler features.** In one process, `bench/bench_handlers.py` as it is: microseconds
per message through the worker's own task runner (`TaskRunner.callback`, the eager
path of an async handler; no broker, no SDK, logs at warning), best of 15 passes of
20,000, for a plain async handler of the message, one of a pydantic model of three
fields (the typed body validated from a 60-byte JSON body), the plain handler with one
`before` hook, with one `after` hook, and with a time limit that is never reached; each
feature's cost is its time minus the plain handler's. A task with no typed body, hooks
or limit runs exactly the plain path: those features cost it nothing.

**The transport seam (bench/seam.py).** The tree of the last commit before the seam
(dc43164, extracted with `git archive`) and this one, interleaved run by run on the same
nsqd and `.venv`, the tree going first alternating (ABBA): `nsqworker run --workers 1` out of the box, the in-process Worker's
async and sync no-op paths, and the offline feed's CPU microseconds per message; each
"within 5% of before" target compares the two trees' medians. The ">= 15x pynsq" target
is absolute: it moves with pynsq's own rate on the day, and Go's `bench_reader` (the
consume section's limit) is itself at about 15-17x pynsq on this machine, so a run can
miss it while after / before holds; both are shown.

**NATS JetStream (bench/nats.py).** One nats-server v2.15.2 with JetStream, started for
the section. Each contender runs in its own process and drains a backlog of
{nats_count:,} messages of 100 bytes, published to a stream of its own before it starts;
the handler is an async no-op. The clock runs from the first message a handler saw to
the moment the server counts every message acknowledged (the consumer's ack floor,
looked at every 5 ms near the end, less often before: each look costs the server CPU). Contenders, interleaved in each run: `nsqworker run --transport
nats --nats URL` with default settings (the task sets `max_in_flight=500`, the
window natscli buffers, as the NSQ task sets bench_reader's 2,500; and again with the
task setting no window, the default 100), FastStream's NATS
JetStream pull subscriber (`PullSub(batch_size=500)`, a durable consumer, acking after
the handler), a bare nats-py loop (`pull_subscribe`, `fetch(500)`, `await msg.ack()` per
message, no framework), and the limit, NATS's own
client: natscli v0.5.0's `nats bench js consume` (nats.go, a durable consumer, explicit
acks, 500 buffered; its own clock, first to last message received, which is kinder than
ours). While `nsqworker run` and natscli drain, nats-server's own CPU time (user +
system, from `/proc/<pid>/stat`, the contender's start included) is divided by the
messages: the server runs on the same two cores, so each microsecond it spends on a
message is one the consumer cannot have. Publishing, {nats_publish_count:,} messages of 100 bytes per case, each in its
own process: our `NatsProducer` one at a time, 1,000 at once and `publish_many` of 100,
beside natscli's `nats bench js pub sync` (one at a time) and `pub async --batch 1000`.
Then the latency of `nsqworker run --transport nats`: {nats_rate:,} msg/s for
{nats_latency_s:g} s, each body carrying its publish time, the handler recording
publish -> handler; the first tenth is warm-up.

**RabbitMQ Streams (bench/streams.py).** One RabbitMQ 4.0.5 (the root filesystem of
`scripts/install-tools rabbitmq`, run with chroot), started for the section. Consume: each
run publishes {streams_count:,} messages of 100 bytes to a fresh stream, then each
contender, in its own process, reads that stream from its first offset (the same chunks
for all); its handler counts, and the process notes the time of the first and the last
message itself. Contenders, interleaved in each run: `nsqworker run --transport
rabbitmq-stream --rabbitmq URI` with default settings (the whole task layer: the window,
the offset watermark stored every 0.2 s); the official Java client
(`com.rabbitmq:stream-client` 1.11.0 from `scripts/install-java`, Java 17) with its
default consumer settings and a handler that takes each body and counts, the limit
(`bench/java/StreamConsume.java`); and a bare rstream consumer with `amqp_decoder` and a
counting callback. Publish: 100-byte bodies for {publish_s:g} s to a fresh stream, every
one confirmed, one at a time, 1,000 at once, and in batches of 100 one at a time, by
nsqworker's `StreamProducer` (`publish`, `asyncio.gather`, `publish_many`) and by the Java
client's producer with its defaults (at most 1 or 1,000 unconfirmed; 100 sent, then every
confirmation awaited: `bench/java/StreamPublish.java`; it batches what it is given for up
to its 100 ms publishing delay, which is what one at a time pays there).

## Running

    make bench                                # the full run; rewrites this file
    .venv/bin/python -m bench --quick         # smoke check: small, once, prints only
    .venv/bin/python -m bench --only consume,latency --runs 5
    .venv/bin/python -m bench.profile --path worker-async --profiler pyinstrument
    .venv/bin/python -m bench.profile --path consumer --feed nsqd --profiler cprofile

A run with `--quick` or `--only` prints its table but leaves this file alone unless
`--out DIR` is given.

Spark's figures are measured by hand, not by `make bench`: [spark.md](spark.md#overhead)
(session and spark-submit) and [spark.md](spark.md#throughput-of-the-sources) (streaming).
"""


def method(cfg: Config, loop: str, mem_queue: int) -> str:
    return METHOD.format(
        mem_queue=mem_queue,
        loop=loop,
        count=cfg.consume_count,
        mif=cfg.max_in_flight,
        publish_s=cfg.publish_seconds,
        batch=cfg.concurrent_batch,
        mpub=cfg.mpub_batch,
        rates=" and ".join(f"{r:,} msg/s" for r in cfg.latency_rates),
        latency_s=cfg.latency_seconds,
        idle=cfg.idle_tasks,
        tasks=cfg.scale_tasks,
        tasks_mif=cfg.scale_max_in_flight,
        per_task=cfg.scale_per_task,
        nsqd=cfg.nsqd_count,
        per_nsqd=cfg.per_nsqd,
        nsqd_mif=cfg.nsqd_max_in_flight,
        cpu_count=cfg.cpu_count,
        telemetry_count=cfg.telemetry_count,
        telemetry_runs=cfg.runs + cfg.telemetry_extra_runs,
        outofbox_runs=cfg.runs + cfg.outofbox_extra_runs,
        nats_count=cfg.nats_count,
        nats_publish_count=cfg.nats_publish_count,
        nats_rate=1000,
        nats_latency_s=cfg.nats_latency_seconds,
        streams_count=cfg.streams_count,
    )
