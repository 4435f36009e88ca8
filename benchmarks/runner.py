"""Runs every system's benchmark script on one throwaway Redis and reports them side by side.

asyncq runs in this interpreter's environment; each peer runs in its own virtualenv
under ``benchmarks/.envs/<peer>`` (their redis-py pins conflict), created on first
use and reused while its pinned requirements are unchanged. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.systems._common import Resp

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "benchmarks" / ".envs"
RESULTS = ROOT / "benchmarks" / "results"

UVLOOP = "uvloop==0.23.*"
PEER_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "arq": ("arq==0.28.0", "redis[hiredis]", UVLOOP),
    # saq 0.26.4 imports typing_extensions without declaring it
    "saq": ("saq[redis,hiredis]==0.26.*", "typing_extensions", UVLOOP),
    # streaq talks to Redis through coredis, not redis-py: no hiredis
    "streaq": ("streaq==7.2.*", UVLOOP),
    "taskiq": ("taskiq==0.13.*", "taskiq-redis==1.2.*", "redis[hiredis]", UVLOOP),
}


@dataclasses.dataclass(frozen=True)
class SystemSpec:
    name: str
    module: str
    env: str | None  # None: this interpreter (asyncq)
    variant: str = ""


SYSTEMS = {
    s.name: s
    for s in (
        SystemSpec("asyncq", "asyncq", None),
        SystemSpec("arq", "arq", "arq"),
        SystemSpec("arq-poll50", "arq", "arq", "poll50"),
        SystemSpec("saq", "saq", "saq"),
        SystemSpec("streaq", "streaq", "streaq"),
        SystemSpec("taskiq", "taskiq", "taskiq"),
    )
}
DEFAULT_SYSTEMS = ("asyncq", "arq", "saq", "streaq", "taskiq")
DEFAULT_QUICK_SYSTEMS = ("asyncq",)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- environments


def env_python(env: str) -> Path:
    return ENVS / env / "bin" / "python"


def ensure_env(env: str, *, reinstall: bool = False) -> Path:
    """The peer's virtualenv python, creating or refreshing the env when its pins changed."""
    requirements = PEER_REQUIREMENTS[env]
    path = ENVS / env
    marker = path / "bench-requirements.txt"
    wanted = "\n".join((f"python {platform.python_version()}", *requirements)) + "\n"
    python = env_python(env)
    if not reinstall and python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    log(f"creating virtualenv {path.relative_to(ROOT)} ({', '.join(requirements)})")
    shutil.rmtree(path, ignore_errors=True)
    ENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    install_log = ENVS / f"{env}-install.log"
    with install_log.open("w") as out:
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", *requirements],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"pip install for {env} failed; see {install_log}")
    marker.write_text(wanted)
    return python


# --------------------------------------------------------------------------- redis


@contextlib.contextmanager
def redis_server(url: str | None, *, unix_socket: bool = True) -> Iterator[str]:
    """*url* as given, or a throwaway redis-server on a free port (no persistence)."""
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit(
            "redis-server is not on PATH (apt-get install redis-server) or use --redis-url"
        )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="asyncq-bench-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--daemonize", "no", "--loglevel", "warning",
         # A local Redis usually has a unix socket too; asyncq's script opts in to using it
         # (peers are given the TCP URL and stay on TCP, as their users would configure them).
         *(("--unixsocket", os.path.join(workdir, "redis.sock"), "--unixsocketperm", "700")
           if unix_socket else ())],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                Resp(url, timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
        log(f"redis-server {binary} on port {port} (pid {proc.pid})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- one system


def run_system(
    spec: SystemSpec, python: Path, url: str, passthrough: Sequence[str], timeout: float
) -> dict[str, Any]:
    """Run one system script; its records by phase, plus ``error`` when it failed."""
    resp = Resp(url)
    resp.call("FLUSHDB")
    resp.close()
    cmd = [str(python), "-m", f"benchmarks.systems.{spec.module}", "--url", url, *passthrough]
    if spec.variant:
        cmd += ["--variant", spec.variant]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    records: dict[str, Any] = {}
    started = time.monotonic()
    # its own session, so that a hung system can be killed together with its worker processes
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.start()
    error: str | None = None
    try:
        for raw in proc.stdout:
            line = raw.strip()
            if not line.startswith("{"):
                if line:
                    print(f"[{spec.name}] {line}", file=sys.stderr)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                print(f"[{spec.name}] {line}", file=sys.stderr)
                continue
            records[record["phase"]] = record
            log(f"  {spec.name}: {_progress(record)}")
        rc = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill_group()
            proc.wait()
    if time.monotonic() - started >= timeout:
        error = f"killed after {timeout:.0f} s"
    elif rc != 0:
        error = f"exited with code {rc}"
    for phase in ("process", "latency"):
        rec = records.get(phase)
        if rec and (rec.get("error") or rec.get("timed_out")):
            error = error or f"{phase}: {rec.get('error') or 'timed out'}"
    missing = [p for p in PHASES if p not in records]
    if missing and error is None:
        error = f"missing phases {missing}"
    return {"system": spec.name, "records": records, "error": error}


PHASES = (
    "meta",
    "enqueue_serial",
    "enqueue_c32",
    "enqueue_c1000",
    "enqueue_fast",
    "process",
    "leftovers",
    "latency",
)


def _progress(r: dict[str, Any]) -> str:
    phase: str = r["phase"]
    if phase == "meta":
        return f"versions {r['versions']}, loop {r['event_loop']}"
    if phase.startswith("enqueue"):
        p99 = f", p99 {r['p99_ms']:.2f} ms" if "p99_ms" in r else ""
        return f"{phase} {r['tasks_per_s']:,.0f} tasks/s{p99}"
    if phase == "process":
        return (
            f"process {r['tasks_per_s']:,.0f} tasks/s,"
            f" {r['worker_cpu_us_per_task']:.0f} µs CPU/task,"
            f" handler calls − N = {r['handler_calls_minus_n']}"
        )
    if phase == "leftovers":
        return f"{r['dbsize']} keys left ({r['persistent_keys']} without TTL)"
    if phase == "latency":
        return f"pickup p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
    return phase


# --------------------------------------------------------------------------- report


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    get: Callable[[dict[str, Any]], float | None]
    fmt: str  # "rate", "ms", "count" (signed), "int", "float", "us"
    ratio: bool = False


def _field(phase: str, key: str) -> Callable[[dict[str, Any]], float | None]:
    def get(records: dict[str, Any]) -> float | None:
        value = records.get(phase, {}).get(key)
        return None if value is None else float(value)

    return get


_FAST, _SERIAL, _PROC, _LAT, _LEFT = (
    "enqueue_fast",
    "enqueue_serial",
    "process",
    "latency",
    "leftovers",
)
ROWS = (
    Row("enqueue, fast path, tasks/s ¹", _field(_FAST, "tasks_per_s"), "rate", True),
    Row("enqueue, serial `await`, tasks/s", _field(_SERIAL, "tasks_per_s"), "rate", True),
    Row("enqueue, serial, p99 ms per call", _field(_SERIAL, "p99_ms"), "ms"),
    Row("enqueue, 32 callers, tasks/s", _field("enqueue_c32", "tasks_per_s"), "rate", True),
    Row("enqueue, 32 callers, p99 ms per call", _field("enqueue_c32", "p99_ms"), "ms"),
    Row("enqueue, 1,000 callers, tasks/s", _field("enqueue_c1000", "tasks_per_s"), "rate", True),
    Row("enqueue, 1,000 callers, p99 ms per call", _field("enqueue_c1000", "p99_ms"), "ms"),
    Row("client CPU µs / task, serial enqueue", _field(_SERIAL, "client_cpu_us_per_task"), "us"),
    Row("process, 1 worker, conc. 100, tasks/s", _field(_PROC, "tasks_per_s"), "rate", True),
    Row("pickup latency p50, ms", _field(_LAT, "p50_ms"), "ms"),
    Row("pickup latency p99, ms", _field(_LAT, "p99_ms"), "ms"),
    Row("handler calls − N", _field(_PROC, "handler_calls_minus_n"), "count"),
    Row("tasks never run (lost)", _field(_PROC, "lost"), "count"),
    Row("Redis commands / task, enqueue ²", _field(_SERIAL, "redis_cmds_per_task"), "float"),
    Row("Redis commands / task, process", _field(_PROC, "redis_cmds_per_task"), "float"),
    Row("worker CPU µs / task", _field(_PROC, "worker_cpu_us_per_task"), "us"),
    Row("redis-server CPU µs / task, process", _field(_PROC, "redis_cpu_us_per_task"), "us"),
    Row("client CPU µs / task, enqueue (fast path)", _field(_FAST, "client_cpu_us_per_task"), "us"),
    Row("redis-server CPU µs / task, enqueue (fast path)", _field(_FAST, "redis_cpu_us_per_task"),
        "us"),
    Row("keys left after processing N ³", _field(_LEFT, "dbsize"), "int"),
    Row("… of which without TTL", _field(_LEFT, "persistent_keys"), "int"),
)  # fmt: skip


def _fmt(value: float, kind: str) -> str:
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "ms":
        return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"
    if kind == "count":
        return f"{value:+.0f}" if value else "0"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "float":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def summarize(runs: Sequence[dict[str, dict[str, Any]]], systems: Sequence[str]) -> dict[str, Any]:
    """Per system and row: all values over the runs, median, min, max."""
    out: dict[str, Any] = {}
    for name in systems:
        rows: dict[str, Any] = {}
        for row in ROWS:
            values = [
                v
                for run in runs
                if name in run and not run[name]["error"]
                and (v := row.get(run[name]["records"])) is not None
            ]  # fmt: skip
            if values:
                rows[row.label] = {
                    "values": values,
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                }
        out[name] = rows
    return out


def _cell(stats: dict[str, Any] | None, kind: str) -> str:
    if not stats:
        return "–"
    values = stats["values"]
    if kind == "count":
        distinct = sorted(set(values))
        if len(distinct) == 1:
            return _fmt(distinct[0], kind) + (f" ×{len(values)}" if len(values) > 1 else "")
        return ", ".join(_fmt(v, kind) for v in values)
    text = _fmt(stats["median"], kind)
    low, high = _fmt(stats["min"], kind), _fmt(stats["max"], kind)
    if len(values) > 1 and low != high:
        text += f" ({low}–{high})"
    return text


def render_table(summary: dict[str, Any], systems: Sequence[str], n_runs: int) -> str:
    peers = [s for s in systems if s != "asyncq"]
    with_ratio = "asyncq" in systems and bool(peers)
    header = ["metric", *systems] + (["asyncq ÷ best peer"] if with_ratio else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in ROWS:
        cells = [row.label] + [_cell(summary[s].get(row.label), row.fmt) for s in systems]
        if with_ratio:
            ratio = "–"
            ours = summary["asyncq"].get(row.label)
            best = [summary[p][row.label]["median"] for p in peers if row.label in summary[p]]
            if row.ratio and ours and best and max(best) > 0:
                ratio = f"{ours['median'] / max(best):.2f}×"
            cells.append(ratio)
        lines.append("| " + " | ".join(cells) + " |")
    note = "median (min–max) of " + str(n_runs) + " runs" if n_runs > 1 else "one run"
    lines += [
        "",
        f"Cells: {note}. ¹ asyncq: `Client.enqueue_many`, streaq: `Worker.enqueue_many` (one "
        "pipeline); arq, saq, taskiq: 32 concurrent `enqueue` calls (`asyncio.gather`). "
        "² serial phase, `INFO commandstats` incl. commands run inside Lua. "
        "³ after the worker shut down; see the leftovers section for what they are.",
    ]
    return "\n".join(lines)


def render_leftovers(results: Sequence[dict[str, Any]]) -> str:
    lines = ["Left in Redis after processing (last run):"]
    for res in results:
        rec = res["records"].get("leftovers")
        if not rec:
            continue
        lines.append(
            f"- {res['system']} ({rec['dbsize']} keys, {rec['persistent_keys']} without TTL;"
            f" retention: {rec['retention']})"
        )
        for p in rec["patterns"][:6]:
            elements = f", {p['elements']} elements" if p["type"] != "string" else ""
            lines.append(
                f"    {p['pattern']}  [{p['type']}] ×{p['count']}"
                f" ({p['persistent']} without TTL{elements})"
            )
    return "\n".join(lines)


def machine_info(url: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        info["memory_gib"] = round(mem_kb / 2**20, 1)
    resp = Resp(url)
    server = resp.info("server")
    resp.close()
    info["redis_version"] = server.get("redis_version")
    return info


# --------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="asyncq beside arq, saq, streaq and taskiq on one throwaway Redis.",
    )
    p.add_argument(
        "--quick", action="store_true", help="small N for a smoke run (default: asyncq only)"
    )
    p.add_argument("--systems", help=f"comma-separated, from {','.join(SYSTEMS)}")
    p.add_argument(
        "--runs", type=int, default=1, help="full passes over all systems (median shown)"
    )
    p.add_argument("--json", type=Path, help="output file (default benchmarks/results/<date>.json)")
    p.add_argument(
        "--redis-url", help="use this Redis instead of a throwaway one (ITS DATABASE IS FLUSHED)"
    )
    p.add_argument(
        "--no-unix-socket",
        action="store_true",
        help="the throwaway Redis listens on TCP only (everyone on TCP, asyncq included)",
    )
    p.add_argument("--reinstall", action="store_true", help="recreate the peer virtualenvs")
    p.add_argument("--n", type=int, help="tasks for fast-path enqueue and processing (20000)")
    p.add_argument("--serial-n", type=int, help="tasks for serial enqueue (5000)")
    p.add_argument("--latency-n", type=int, help="pickup latency samples (200)")
    p.add_argument("--concurrency", type=int, help="worker concurrency (100)")
    p.add_argument("--batch-size", type=int, help="tasks per batch-API call (0 = all at once)")
    p.add_argument("--settle", type=float, help="seconds to wait for late duplicate runs (1.0)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    default = DEFAULT_QUICK_SYSTEMS if args.quick else DEFAULT_SYSTEMS
    args.system_list = (
        [s.strip() for s in args.systems.split(",")] if args.systems else list(default)
    )
    unknown = [s for s in args.system_list if s not in SYSTEMS]
    if unknown or not args.system_list:
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if len(set(args.system_list)) != len(args.system_list):
        p.error("a system is listed twice")
    return args


def _passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--quick"] if args.quick else []
    for flag in ("n", "serial_n", "latency_n", "concurrency", "batch_size", "settle"):
        value = getattr(args, flag)
        if value is not None:
            out += [f"--{flag.replace('_', '-')}", str(value)]
    return out


def _default_json() -> Path:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    path = RESULTS / f"{stamp}.json"
    if path.exists():
        path = RESULTS / f"{stamp}-{datetime.now(UTC).strftime('%H%M%S')}.json"
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    systems: list[str] = args.system_list
    pythons: dict[str, Path] = {}
    setup_errors: dict[str, str] = {}
    for name in systems:
        env = SYSTEMS[name].env
        try:
            pythons[name] = (
                Path(sys.executable) if env is None else ensure_env(env, reinstall=args.reinstall)
            )
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            setup_errors[name] = f"environment setup failed: {exc}"
            log(f"{name}: {setup_errors[name]}")
    timeout = 180.0 if args.quick else 1800.0
    started = datetime.now(UTC)
    runs: list[dict[str, dict[str, Any]]] = []
    with redis_server(args.redis_url, unix_socket=not args.no_unix_socket) as url:
        machine = machine_info(url)
        for k in range(args.runs):
            run: dict[str, dict[str, Any]] = {}
            for name in systems:
                if name in setup_errors:
                    run[name] = {"system": name, "records": {}, "error": setup_errors[name]}
                    continue
                log(f"run {k + 1}/{args.runs}: {name}")
                run[name] = run_system(
                    SYSTEMS[name], pythons[name], url, _passthrough(args), timeout
                )
                if run[name]["error"]:
                    log(f"  {name} FAILED: {run[name]['error']}")
            runs.append(run)
    summary = summarize(runs, systems)
    table = render_table(summary, systems, args.runs)
    last = [runs[-1][s] for s in systems]
    leftovers = render_leftovers(last)
    versions = {s: runs[-1][s]["records"].get("meta", {}).get("versions", {}) for s in systems}
    heading = (
        f"asyncq benchmark {started:%Y-%m-%d %H:%M} UTC · {machine.get('cpus')} CPUs"
        f" ({machine.get('cpu_model', '?')}), {machine.get('memory_gib', '?')} GiB ·"
        f" Linux {machine['kernel']} · Python {machine['python']} · redis-server"
        f" {machine['redis_version']} · N = {_first(runs, systems, 'process', 'n')}"
    )
    print(heading)
    print("versions: " + "; ".join(f"{s} {json.dumps(v)}" for s, v in versions.items()))
    print()
    print(table)
    print()
    print(leftovers)
    failures = [
        f"{s}: {runs[k][s]['error']}"
        for k in range(len(runs))
        for s in systems
        if runs[k][s]["error"]
    ]
    out_path = args.json or _default_json()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "schema": 1,
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "machine": machine,
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "systems": systems,
        "runs": runs,
        "summary": summary,
        "table": table,
        "failures": failures,
    }
    out_path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    log(f"wrote {out_path}")
    status = 0
    if failures:
        log("failed: " + "; ".join(failures))
        status = 1
    if "asyncq" in systems:
        bad = [
            f"run {k + 1} {phase}: handler calls − N = {r['handler_calls_minus_n']},"
            f" lost = {r['lost']}"
            for k, run in enumerate(runs)
            for phase in ("process", "latency")
            if (r := run["asyncq"]["records"].get(phase))
            and (r["handler_calls_minus_n"] or r["lost"])
        ]
        if bad:
            log("asyncq correctness check failed: " + "; ".join(bad))
            status = 1
    return status


def _first(
    runs: Sequence[dict[str, dict[str, Any]]], systems: Sequence[str], phase: str, key: str
) -> Any:
    for run in runs:
        for s in systems:
            value = run[s]["records"].get(phase, {}).get(key)
            if value is not None:
                return value
    return "?"
