"""nsqworker's benchmark suite: ``make bench`` (``python -m bench``).

Every case runs against a real nsqd started for the run on 127.0.0.1, and every client
under test (ours, pynsq, NSQ's own Go bench_reader/bench_writer) runs in its own
process, side by side in the same run, so the results are reported as ratios. See
``docs/benchmarks.md`` for the method and the latest results.
"""
