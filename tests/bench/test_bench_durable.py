"""The durable step benchmark (``python -m benchmarks.durable``) end to end, smoke-sized;
no timing is asserted: every variant measured and every ratio printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from benchmarks import runner

pytestmark = [pytest.mark.bench, pytest.mark.subprocess]

DURABLE_DB = 11  # the benchmark flushes its database; away from db 0, ab's 12, bench_quick's 13


@pytest.mark.timeout(180)
def test_durable_bench_measures_every_variant_and_prints_the_ratios(redis_url: str) -> None:
    url = urlsplit(redis_url)._replace(path=f"/{DURABLE_DB}").geturl()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.durable", "--quick", "--url", url],
        cwd=runner.ROOT, capture_output=True, text=True, timeout=170, check=False,
        env=dict(os.environ, PYTHONPATH=str(runner.ROOT)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    rows: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if line.strip():
            rows.setdefault(line.split()[0], line.split())  # the table's row, not a ratio's
    for variant in ("plain", "chain", "durable"):
        cmds, redis_us, worker_us, e2e = (float(x) for x in rows[variant][1:5])
        assert cmds > 0 and redis_us > 0 and worker_us >= 0 and e2e > 0, rows[variant]
    ratio = r"durable / (\w+) +cmds=[\d.]+x redis_us=[\d.]+x worker_us=\S+ end-to-end"
    ratios = re.findall(ratio, proc.stdout)
    assert ratios == ["plain", "chain"], proc.stdout
