"""Smoke test of the scale benchmark: ``python -m benchmarks.scale --quick --no-plots``.

The benchmark starts its own redis-servers (a standalone one and a three-master
cluster) and worker processes; this runs it once with tiny sizes and checks that
the JSON has every phase with its rows filled in with positive numbers and that
no task was lost. No timing is asserted.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import scale

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.bench,
    pytest.mark.subprocess,
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.xdist_group("bench_scale"),
    pytest.mark.skipif(
        shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
        reason="needs redis-server and redis-cli on PATH",
    ),
]


# Session scope: under --dist loadgroup the worker interleaves other modules' tests
# between this module's, which tears a module-scoped fixture down and would run the
# benchmark again.
@pytest.fixture(scope="session")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("scale") / "scale.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--quick", "--no-plots", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "### Backlog of 5,000 tasks" in proc.stdout  # the markdown report
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def _positive(row: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value = row[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (key, row)


def test_every_phase_is_reported(doc: dict[str, Any]) -> None:
    assert doc["quick"] is True
    assert list(doc["phases"]) == list(scale.PHASES)
    assert doc["markdown"].startswith("## asyncq scale benchmark")


def test_backlog(doc: dict[str, Any]) -> None:
    b = doc["phases"]["backlog"]
    sizes = scale.Sizes.quick()
    assert b["enqueue"]["n"] == sizes.backlog
    _positive(b["enqueue"], "tasks_per_s", "memory_bytes_per_task", "redis_cpu_us_per_task")
    assert b["process"]["processed"] == sizes.backlog
    assert b["process"]["capped"] is False
    _positive(b["process"], "tasks_per_s", "worker_cpu_us_per_task", "redis_cpu_us_per_task")
    assert [r["upto"] for r in b["rows"]][-1] == sizes.backlog
    assert len(b["rows"]) == sizes.backlog_slices
    for row in b["rows"]:
        _positive(row, "enqueue_tasks_per_s", "memory_bytes_per_task", "process_tasks_per_s")


def test_queues(doc: dict[str, Any]) -> None:
    rows = doc["phases"]["queues"]["rows"]
    sizes = scale.Sizes.quick()
    assert {(r["queues"], r["mode"]) for r in rows} == {
        (q, m) for q in sizes.queue_counts for m in ("weighted", "strict")
    }
    for row in rows:
        assert row["processed"] == sizes.queues_n
        _positive(row, "tasks_per_s", "redis_cpu_us_per_task", "worker_cpu_us_per_task")


def test_payload(doc: dict[str, Any]) -> None:
    rows = doc["phases"]["payload"]["rows"]
    assert [r["payload_bytes"] for r in rows] == [100, 10_000, 1_000_000]
    for row in rows:
        _positive(
            row, "enqueue_tasks_per_s", "enqueue_mb_per_s", "process_tasks_per_s",
            "process_mb_per_s",
        )  # fmt: skip


def test_workers(doc: dict[str, Any]) -> None:
    rows = doc["phases"]["workers"]["rows"]
    assert [r["workers"] for r in rows] == list(scale.Sizes.quick().worker_counts)
    for row in rows:
        assert row["processed"] == scale.Sizes.quick().workers_n
        _positive(row, "tasks_per_s", "redis_cpu_us_per_task", "redis_cpu_pct_of_core")


def test_cluster(doc: dict[str, Any]) -> None:
    c = doc["phases"]["cluster"]
    assert len(c["queues"]) == scale.Sizes.quick().cluster_queues
    assert {r["setup"] for r in c["rows"]} == {"one Redis", "cluster (3 masters)"}
    for row in c["rows"]:
        _positive(row, "enqueue_tasks_per_s", "process_tasks_per_s")


def test_idle_and_pickup(doc: dict[str, Any]) -> None:
    i = doc["phases"]["idle"]
    assert [r["queues"] for r in i["idle"]] == [1, 10]
    for row in i["idle"]:
        # an idle server polls rarely (key tracking wakes it): fewer than one command per
        # millisecond, possibly none in the short window
        assert 0 <= row["commands_sent_per_s"] < 1000, row
        assert row["commandstats_calls_per_s"] >= row["commands_sent_per_s"]
    assert len(i["pickup"]) == 3
    for row in i["pickup"]:
        assert row["lost"] == 0, row
        _positive(row, "p50_ms", "p99_ms")
        assert row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]


def test_split_spreads_evenly() -> None:
    assert scale._split(10, 3) == [4, 3, 3]
    assert sum(scale._split(20_000, 1000)) == 20_000
    assert scale._split(2, 4) == [1, 1, 0, 0]
