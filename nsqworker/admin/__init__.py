"""The operator's side: tools that act on a running system from outside the workers.

:mod:`nsqworker.admin.dead_letters` lists, replays and purges dead letters on every
transport (``nsqworker dead-letters``).
"""

from nsqworker.admin.dead_letters import (
    DeadLetter,
    PurgeReport,
    ReplayReport,
    list_dead_letters,
    purge_dead_letters,
    replay_dead_letters,
    replay_sources,
)

__all__ = [
    "DeadLetter",
    "PurgeReport",
    "ReplayReport",
    "list_dead_letters",
    "purge_dead_letters",
    "replay_dead_letters",
    "replay_sources",
]
