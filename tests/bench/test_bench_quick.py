"""Smoke test of the benchmark harness in --quick mode (tiny N; no timing is asserted).

Runs ``benchmarks/systems/asyncq.py`` through the runner (a subprocess driver plus
two worker subprocesses) against the test Redis, in a database of its own, and
checks the JSON records and asyncq's correctness fields. BullMQ for Python (its own
virtualenv under benchmarks/.envs, from PyPI) and BullMQ for Node (``npm ci`` in
benchmarks/node) run the same way at tiny N; each is skipped, with the reason, where
its packages cannot be installed (offline) or ``node`` is missing. The redis-benchmark
reference row is skipped where redis-benchmark is missing. The Python peers arq, saq,
streaq and taskiq are not installed here.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import runner
from benchmarks.systems import _common

# One xdist worker runs the whole module; the runs are session-scoped fixtures because
# --dist loadgroup interleaves other modules' tests, which would tear down a
# module-scoped one and run it again.
pytestmark = [pytest.mark.bench, pytest.mark.xdist_group("bench_quick")]

BENCH_DB = 13  # the harness flushes its database; keep it away from other tests' db 0


def _bench_url(redis_url: str) -> str:
    return urlsplit(redis_url)._replace(path=f"/{BENCH_DB}").geturl()


@pytest.fixture(scope="session")
def quick_result(redis_url: str) -> dict[str, object]:
    return runner.run_system(
        runner.SYSTEMS["asyncq"], Path(sys.executable), _bench_url(redis_url), ["--quick"],
        timeout=120,
    )  # fmt: skip


def _peer_quick(redis_url: str, name: str) -> dict[str, Any]:
    """*name*'s quick run, or a skip naming why its environment cannot be made here."""
    spec = runner.SYSTEMS[name]
    try:
        python = runner.ensure_system(spec)
    except runner.Skipped as exc:
        pytest.skip(f"{name}: {exc}")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # pip or npm failed
        pytest.skip(f"{name}: environment could not be installed ({exc})")
    return runner.run_system(spec, python, _bench_url(redis_url), ["--quick"], timeout=180)


@pytest.fixture(scope="session")
def bullmq_result(redis_url: str) -> dict[str, Any]:
    return _peer_quick(redis_url, "bullmq")


@pytest.fixture(scope="session")
def bullmq_node_result(redis_url: str) -> dict[str, Any]:
    return _peer_quick(redis_url, "bullmq-node")


@pytest.fixture(scope="session")
def reference_result(redis_url: str) -> dict[str, Any]:
    if shutil.which("redis-benchmark") is None:
        pytest.skip("redis-benchmark is not on PATH")
    sizes = {"enqueue_serial": 200, "enqueue_c32": 500}
    url = _bench_url(redis_url)
    latency = _common.Config.quick(url, latency_n=15)
    return runner.run_reference(url, sizes, timeout=60, latency=latency)


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


# --------------------------------------------------------------------------- BullMQ


@pytest.mark.parametrize("which", ["bullmq", "bullmq-node"])
def test_bullmq_quick_run(which: str, request: pytest.FixtureRequest) -> None:
    result = request.getfixturevalue(which.replace("-", "_") + "_result")
    assert result["error"] is None, result["error"]
    records = result["records"]
    assert list(records) == list(runner.PHASES)
    assert records["meta"]["system"] == which
    assert records["meta"]["versions"]["bullmq"] not in ("", "?")
    for phase, n in (("enqueue_serial", 200), ("enqueue_c32", 500), ("enqueue_fast", 500)):
        rec = records[phase]
        assert rec["n"] == n
        assert rec["errors"] == 0
        assert _finite(rec["tasks_per_s"]) and _finite(rec["client_cpu_us_per_task"])
        # BullMQ's addJob is one script call that writes several keys
        assert rec["redis_cmds_per_task"] > 1
    assert records["enqueue_fast"]["method"].startswith("Queue.addBulk")
    proc = records["process"]
    assert proc["lost"] == 0
    assert proc["handler_calls"] >= 500
    assert proc["timed_out"] is False
    assert proc["error"] is None
    assert _finite(proc["worker_cpu_us_per_task"]) and proc["worker_cpu_us_per_task"] > 0
    # removeOnComplete is off by default: every completed job stays, without a TTL
    left = records["leftovers"]
    assert left["persistent_keys"] >= 500
    assert any(p["pattern"] == "bull:bench:completed" for p in left["patterns"])
    lat = records["latency"]
    assert lat["samples"] == 20
    assert lat["lost"] == 0
    assert lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]


# --------------------------------------------------------------------------- the reference


def test_reference_records(reference_result: dict[str, Any], redis_url: str) -> None:
    assert reference_result["error"] is None, reference_result["error"]
    records = reference_result["records"]
    assert records["meta"]["system"] == runner.REFERENCE
    assert "-a" not in records["meta"]["command"]
    for phase, clients, n in (("enqueue_serial", 1, 200), ("enqueue_c32", 32, 500)):
        rec = records[phase]
        assert (rec["callers"], rec["n"]) == (clients, n)
        assert _finite(rec["tasks_per_s"]) and rec["tasks_per_s"] > 0
        assert rec["p50_ms"] <= rec["p99_ms"]
    # one Pub/Sub hop between two processes, every message heard
    hop = records["latency"]
    assert (hop["n"], hop["samples"]) == (15, 15)
    assert _finite(hop["p50_ms"]) and 0 < hop["p50_ms"] <= hop["p99_ms"]
    # its key is flushed afterwards
    resp = _common.Resp(_bench_url(redis_url))
    try:
        assert resp.call("DBSIZE") == 0
    finally:
        resp.close()


def test_benchmark_csv_parsing() -> None:
    text = (
        '"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",'
        '"p99_latency_ms","max_latency_ms"\n"SET","19120.46","0.059","0.016","0.023","0.039",'
        '"1.423","9.327"\n'
    )
    row = runner._parse_benchmark_csv(text)
    assert row is not None
    assert row["rps"] == 19120.46
    assert row["p99_latency_ms"] == 1.423
    assert runner._parse_benchmark_csv("") is None
    assert runner._parse_benchmark_csv('"test","rps"\n"GET","5"\n') is None


# --------------------------------------------------------------------------- the report


def test_headline_has_every_row(
    quick_result: dict[str, Any], reference_result: dict[str, Any]
) -> None:
    """asyncq, a peer, the socket row and the reference row, with ratios to the reference."""
    socket = quick_result | {"system": "asyncq-socket"}
    peer = quick_result | {"system": "bullmq"}
    redispy = {"phase": runner.REDISPY, "client_cpu_us_per_task": 100.0}
    reference = reference_result | {
        "records": reference_result["records"] | {runner.REDISPY: redispy}
    }
    run = {"asyncq": quick_result, "bullmq": peer, "asyncq-socket": socket,
           runner.REFERENCE: reference}  # fmt: skip
    systems = ["asyncq", "bullmq", "asyncq-socket"]
    summary = runner.summarize([run], [*systems, runner.REFERENCE])
    labels = {s: runner.system_label(runner.SYSTEMS[s], run[s]["records"]) for s in systems}
    labels[runner.REFERENCE] = "redis-benchmark SET (physical reference)"
    transports = {s: "TCP" for s in systems} | {"asyncq-socket": "unix socket"}
    lines = runner.render_headline(summary, systems, labels, transports).splitlines()
    assert len(lines) == 2 + 4
    assert lines[2].startswith("| redis-benchmark SET (physical reference) | TCP |")
    assert lines[2].count("1.00×") == 3
    assert lines[3].startswith("| asyncq ")
    assert lines[5].startswith("| asyncq on its unix socket ⁴ (extra row) | unix socket |")
    for line in lines[3:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 2 + len(runner.HEADLINE)
        ratio_serial, ratio_c32 = cells[3], cells[5]
        assert ratio_serial.endswith("×") and ratio_c32.endswith("×"), line
    ref = reference_result["records"]
    expected = (
        quick_result["records"]["enqueue_serial"]["tasks_per_s"]
        / ref["enqueue_serial"]["tasks_per_s"]
    )
    assert summary["asyncq"][runner.SERIAL_RATIO]["median"] == pytest.approx(expected)
    hops = quick_result["records"]["latency"]["p50_ms"] / ref["latency"]["p50_ms"]
    assert summary["asyncq"][runner.PICKUP_RATIO]["median"] == pytest.approx(hops)
    cpu = quick_result["records"]["enqueue_serial"]["client_cpu_us_per_task"] / 100.0
    assert summary["asyncq"][runner.CLIENT_CPU_RATIO]["median"] == pytest.approx(cpu)
    assert runner.CLIENT_CPU_RATIO not in summary[runner.REFERENCE]
    table = runner.render_table(summary, [*systems, runner.REFERENCE], 1).splitlines()
    assert table[0] == (
        "| metric | asyncq | bullmq | asyncq-socket | redis-benchmark | asyncq ÷ best peer |"
    )
    # the socket row is no peer: asyncq ÷ best peer compares with bullmq only (here a copy)
    fast = next(line for line in table if line.startswith("| enqueue, fast path"))
    assert fast.endswith("| 1.00× |")


def test_main_report(redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole runner, tiny: the heading names date, machine, command and commit; a
    server without a unix socket drops the socket row with one line."""
    out_json = tmp_path / "out.json"
    argv = [
        "--quick", "--redis-url", _bench_url(redis_url), "--systems", "asyncq,asyncq-socket",
        "--n", "100", "--serial-n", "50", "--latency-n", "5", "--json", str(out_json),
    ]  # fmt: skip
    assert runner.main(argv) == 0
    out = capsys.readouterr().out
    heading = out.splitlines()[:5]
    assert "SMOKE RUN" in heading[0]
    assert heading[1].startswith("machine: nproc ")
    assert "GiB memory" in heading[1]
    assert heading[3] == "command: python -m benchmarks " + " ".join(argv)
    assert heading[4].startswith("commit: ") and heading[4] != "commit: ?"
    assert "skipped: asyncq-socket: the Redis server has no unix socket" in out
    document = json.loads(out_json.read_text())
    assert document["systems"] == ["asyncq"]
    assert document["skipped"]["asyncq-socket"] == "the Redis server has no unix socket"
    assert document["failures"] == []
    if shutil.which("redis-benchmark"):
        assert "| redis-benchmark SET, one Pub/Sub hop (physical reference) | TCP |" in out
        assert runner.REFERENCE in document["runs"][0]
        # the redis-py SET row, in the reference column only, and asyncq's ratio to it
        redispy = document["runs"][0][runner.REFERENCE]["records"][runner.REDISPY]
        assert redispy["client_cpu_us_per_task"] > 0
        row = next(line for line in out.splitlines() if line.startswith("| redis-py asyncio"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "–" and cells[2] != "–"  # asyncq, then redis-benchmark's column
        ratio = next(line for line in out.splitlines() if line.startswith(
            f"| {runner.CLIENT_CPU_RATIO} |"))  # fmt: skip
        assert ratio.split("|")[2].strip().endswith("×")


def test_asyncq_socket_variant_opts_in() -> None:
    from benchmarks.systems import asyncq as asyncq_script

    cfg = _common.Config.quick("redis://127.0.0.1:6379/3")
    assert asyncq_script._url(cfg) == "redis://127.0.0.1:6379/3"
    socket = _common.Config.quick("redis://127.0.0.1:6379/3", variant="socket")
    assert asyncq_script._url(socket) == "redis://127.0.0.1:6379/3?local_socket=true"
    with pytest.raises(ValueError, match="unknown asyncq variant"):
        asyncq_script._url(_common.Config.quick("redis://h/0", variant="nope"))


def test_missing_tools_are_skipped_with_one_line(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without node and redis-benchmark on PATH, their rows are skipped, not failed."""
    real_which = shutil.which
    hidden = {"node", "npm", "redis-benchmark"}
    monkeypatch.setattr(
        runner.shutil, "which", lambda name, *a, **kw: None if name in hidden else real_which(name)
    )
    with pytest.raises(runner.Skipped, match="node is not on PATH"):
        runner.ensure_node_modules()
    with pytest.raises(runner.Skipped, match="redis-benchmark is not on PATH"):
        runner.run_reference(_bench_url(redis_url), {"enqueue_serial": 1, "enqueue_c32": 1}, 10)
    argv = ["--quick", "--redis-url", _bench_url(redis_url), "--systems", "bullmq-node",
            "--json", str(tmp_path / "out.json")]  # fmt: skip
    assert runner.main(argv) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped: ")]
    assert skipped == [
        "skipped: bullmq-node: node is not on PATH",
        "skipped: redis-benchmark: redis-benchmark is not on PATH (Debian: redis-tools)",
    ]
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["failures"] == []
    assert document["systems"] == []


def test_reference_sizes() -> None:
    """The reference matches the phases' N in --quick and has a floor otherwise."""
    url = "redis://127.0.0.1:6379/13"
    quick = runner.parse_args(["--quick"])
    assert runner._sizes(quick, url) == {"enqueue_serial": 200, "enqueue_c32": 500}
    full = runner.parse_args([])
    assert runner._sizes(full, url) == {"enqueue_serial": 20_000, "enqueue_c32": 100_000}
    big = runner.parse_args(["--n", "250000", "--serial-n", "30000"])
    assert runner._sizes(big, url) == {"enqueue_serial": 30_000, "enqueue_c32": 250_000}
