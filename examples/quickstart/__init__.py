"""The quickstart example: one async and one sync task (see README.md)."""
