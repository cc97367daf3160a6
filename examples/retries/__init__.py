"""Retries, rejects and dead letters, one task each (see README.md)."""
