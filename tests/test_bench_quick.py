"""Smoke test of the benchmark harness: asyncq's system script in --quick mode.

Runs ``benchmarks/systems/asyncq.py`` through the runner (a subprocess driver plus
two worker subprocesses) against the test Redis, in a database of its own, and
checks the JSON records and asyncq's correctness fields. Peers are not installed
here and no timing is asserted.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import runner
from benchmarks.systems import _common

# one xdist worker runs the whole module, so the quick run happens once
pytestmark = pytest.mark.xdist_group("bench_quick")

BENCH_DB = 13  # the harness flushes its database; keep it away from other tests' db 0


@pytest.fixture(scope="module")
def quick_result(redis_url: str) -> dict[str, object]:
    url = urlsplit(redis_url)._replace(path=f"/{BENCH_DB}").geturl()
    return runner.run_system(
        runner.SYSTEMS["asyncq"], Path(sys.executable), url, ["--quick"], timeout=120
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def test_all_phases_reported(quick_result: dict) -> None:
    assert quick_result["error"] is None
    records = quick_result["records"]
    assert list(records) == list(runner.PHASES)
    meta = records["meta"]
    assert meta["system"] == "asyncq"
    assert meta["schema"] == 1
    assert "redis" in meta["versions"]


def test_enqueue_records(quick_result: dict) -> None:
    records = quick_result["records"]
    for phase, n in (("enqueue_serial", 200), ("enqueue_fast", 500)):
        rec = records[phase]
        assert rec["n"] == n
        assert rec["errors"] == 0
        for key in (
            "seconds",
            "tasks_per_s",
            "client_cpu_us_per_task",
            "redis_cpu_us_per_task",
            "redis_cmds_per_task",
        ):
            assert _finite(rec[key]), (phase, key, rec[key])
        # every enqueue reaches Redis: at least one command per task
        assert rec["redis_cmds_per_task"] >= 1
        assert sum(rec["by_command"].values()) >= n
    assert records["enqueue_fast"]["method"].startswith("Client.enqueue_many")


def test_processing_is_exact(quick_result: dict) -> None:
    rec = quick_result["records"]["process"]
    assert rec["n"] == 500
    assert rec["handler_calls"] == 500
    assert rec["handler_calls_minus_n"] == 0
    assert rec["duplicates"] == 0
    assert rec["lost"] == 0
    assert rec["timed_out"] is False
    assert rec["error"] is None
    for key in ("seconds", "tasks_per_s", "worker_cpu_us_per_task", "redis_cpu_us_per_task"):
        assert _finite(rec[key]), (key, rec[key])
    assert rec["redis_cmds_per_task"] > 0


def test_nothing_per_task_left_in_redis(quick_result: dict) -> None:
    rec = quick_result["records"]["leftovers"]
    patterns = {p["pattern"]: p for p in rec["patterns"]}
    # without retention a finished task leaves no hash, no list or set entry behind
    assert not [p for p in patterns if ":t:" in p], patterns
    assert rec["dbsize"] < 10, patterns
    for p in rec["patterns"]:
        if p["type"] in ("list", "zset"):
            assert p["elements"] == 0, p


def test_latency_record(quick_result: dict) -> None:
    rec = quick_result["records"]["latency"]
    assert rec["n"] == rec["samples"] == 20
    assert rec["handler_calls_minus_n"] == 0
    assert rec["lost"] == 0
    assert rec["timed_out"] is False
    for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
        assert _finite(rec[key]), (key, rec[key])
    assert rec["p50_ms"] <= rec["p99_ms"] <= rec["max_ms"]


def test_table_renders(quick_result: dict) -> None:
    runs = [{"asyncq": quick_result}]
    summary = runner.summarize(runs, ["asyncq"])
    table = runner.render_table(summary, ["asyncq"], 1)
    lines = table.splitlines()
    assert lines[0] == "| metric | asyncq |"
    for row in runner.ROWS:
        assert any(line.startswith(f"| {row.label} |") for line in lines), row.label
    assert "| handler calls − N | 0 |" in lines
    assert "asyncq" in runner.render_leftovers([quick_result])


def test_failing_system_is_reported(redis_url: str) -> None:
    url = urlsplit(redis_url)._replace(path=f"/{BENCH_DB}").geturl()
    spec = runner.SystemSpec("missing", "no_such_system", None)
    result = runner.run_system(spec, Path(sys.executable), url, ["--quick"], timeout=60)
    assert result["records"] == {}
    assert result["error"] == "exited with code 1"


@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=2, max_size=300),
    st.integers(min_value=1, max_value=99),
)
def test_percentile_matches_statistics(values: list[float], p: int) -> None:
    expected = statistics.quantiles(values, n=100, method="inclusive")[p - 1]
    assert _common.percentile(sorted(values), p) == pytest.approx(expected, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize(
    ("key", "pattern"),
    [
        (b"asynq:{default}:t:0b6a5c1e-6f1d-4c4e-9b1a-2f0c8d7e6a5b", "asynq:{default}:t:*"),
        (b"asynq:{default}:processed:2026-11-21", "asynq:{default}:processed:*"),
        (b"arq:result:4f1c0a9e2b7d4e8f9a6b3c2d1e0f9a8b", "arq:result:*"),
        (b"streaq:default:queues:normal", "streaq:default:queues:normal"),
        (b"saq:default:worker_info:17", "saq:default:worker_info:*"),
    ],
)
def test_key_pattern(key: bytes, pattern: str) -> None:
    assert _common.key_pattern(key) == pattern
