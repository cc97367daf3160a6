"""A job whose driver fails at once, naming why (the cluster tests' failing job)."""

import sys

print("nsqworker-test: the input is missing, giving up", file=sys.stderr)
sys.exit(3)
