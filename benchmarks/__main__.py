"""``python -m benchmarks [--quick] [--systems asyncq,saq,...] [--json out.json]``."""

from benchmarks.runner import main

raise SystemExit(main())
