"""Periodic tasks: ``@task(..., schedule="0 6 * * *", timezone="Europe/Berlin")``.

At each tick one candidate, the leader, publishes ``{"task": ..., "scheduled_for": ...}``
to the task's topic; every ``nsqworker run`` supervisor is a candidate. The pieces:

* :mod:`.cron`: cron expressions and fire times, pure (no I/O, no clock);
* :mod:`.lease`: leader election on a record with compare-and-set, any backend;
* :mod:`.kube` (a Kubernetes Lease), :mod:`.nats_kv` (a JetStream KV entry),
  :mod:`.postgres` (a PostgreSQL row with a fencing token), and
  :class:`~.lease.LocalStore` (``none``): the backends;
* :mod:`.firing`: publish each due tick, then record it with the lease;
* :mod:`.runner`: the supervisor's candidate, on a thread of its own;
* :mod:`.settings`: the ``schedule_*`` settings.

docs/schedules.md says what each backend guarantees.
"""

from __future__ import annotations

from nsqworker.schedules.cron import Schedule, ScheduleError, format_tick

__all__ = ["Schedule", "ScheduleError", "format_tick"]
