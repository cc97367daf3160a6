"""Test job: fails at once, before starting a SparkSession."""

import sys

print("failing on purpose", file=sys.stderr)
sys.exit(3)
