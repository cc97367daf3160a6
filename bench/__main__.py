"""``python -m bench``: run the benchmark suite (see ``bench.runner``)."""

from bench.runner import main

raise SystemExit(main())
