"""Tasks the cluster tests (tests/cluster) run in the chart's pods."""
