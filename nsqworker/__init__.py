"""nsqworker: run Python task handlers on NSQ topics."""

__version__ = "0.1.0"
