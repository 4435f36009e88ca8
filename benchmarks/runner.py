"""Runs every system's benchmark script on one throwaway Redis and reports them side by side.

asyncq runs in this interpreter's environment; each Python peer runs in its own
virtualenv under ``benchmarks/.envs/<peer>`` (their redis-py pins conflict), created on
first use and reused while its pinned requirements are unchanged; BullMQ for Node runs
from ``benchmarks/node/node_modules`` (``npm ci`` from the committed lock file). Every
system talks to Redis over TCP; ``asyncq-socket`` is asyncq again with its opt-in unix
socket, an extra row. ``redis-benchmark`` SET with 1 and 32 clients, and one Pub/Sub hop
between two processes (:mod:`benchmarks.pubsub_probe`), run in every round as the
physical reference. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import importlib.util
import json
import os
import platform
import re
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
from urllib.parse import unquote, urlsplit

from benchmarks.pubsub_probe import probe
from benchmarks.systems._common import Config, Resp

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "benchmarks" / ".envs"
NODE_DIR = ROOT / "benchmarks" / "node"
RESULTS = ROOT / "benchmarks" / "results"

UVLOOP = "uvloop==0.23.*"
PEER_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "arq": ("arq==0.28.0", "redis[hiredis]", UVLOOP),
    # saq 0.26.4 imports typing_extensions without declaring it
    "saq": ("saq[redis,hiredis]==0.26.*", "typing_extensions", UVLOOP),
    # streaq talks to Redis through coredis, not redis-py: no hiredis
    "streaq": ("streaq==7.2.*", UVLOOP),
    "taskiq": ("taskiq==0.13.*", "taskiq-redis==1.2.*", "redis[hiredis]", UVLOOP),
    # BullMQ's official Python port (redis-py)
    "bullmq": ("bullmq==3.4.*", "redis[hiredis]", UVLOOP),
}


@dataclasses.dataclass(frozen=True)
class SystemSpec:
    name: str
    module: str
    env: str | None  # None: this interpreter (asyncq, and the driver of BullMQ for Node)
    variant: str = ""
    node: bool = False  # the library runs in node (benchmarks/node), driven from here
    label: str = ""  # the headline table's name for it (default: name and version)
    version_key: str = ""  # which entry of its meta versions names it (default: its module)


SYSTEMS = {
    s.name: s
    for s in (
        SystemSpec("asyncq", "asyncq", None),
        SystemSpec("asyncq-socket", "asyncq", None, "socket", version_key="-",
                   label="asyncq on its unix socket ⁴ (extra row)"),
        SystemSpec("arq", "arq", "arq"),
        SystemSpec("arq-poll50", "arq", "arq", "poll50", label="arq, poll_delay 0.05 s",
                   version_key="-"),
        SystemSpec("saq", "saq", "saq"),
        SystemSpec("streaq", "streaq", "streaq"),
        SystemSpec("taskiq", "taskiq", "taskiq"),
        SystemSpec("bullmq", "bullmq", "bullmq", label="BullMQ for Python"),
        SystemSpec("bullmq-node", "bullmq_node", None, node=True, label="BullMQ for Node",
                   version_key="bullmq"),
    )
}  # fmt: skip
DEFAULT_SYSTEMS = (
    "asyncq", "arq", "saq", "streaq", "taskiq", "bullmq", "bullmq-node", "asyncq-socket"
)  # fmt: skip
DEFAULT_QUICK_SYSTEMS = ("asyncq", "bullmq", "bullmq-node", "asyncq-socket")
REFERENCE = "redis-benchmark"
"""The physical reference: ``redis-benchmark -t set`` with 1 and with 32 clients, and one
Pub/Sub hop between two processes on the latency phase's cadence."""
REFERENCE_CLIENTS = {"enqueue_serial": 1, "enqueue_c32": 32}
"""Which enqueue phase each reference measurement stands beside (same N, same callers)."""


class Skipped(Exception):
    """A system that cannot run on this machine (a missing tool): one line, not a failure."""


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


def ensure_node_modules(*, reinstall: bool = False) -> Path:
    """``node`` for BullMQ for Node, after ``npm ci`` in benchmarks/node when its lock changed.

    Raises :class:`Skipped` without ``node`` or ``npm`` on PATH, RuntimeError when
    ``npm ci`` fails (offline, say); its output goes to
    ``benchmarks/.envs/bullmq-node-install.log``.
    """
    node = shutil.which("node")
    if node is None:
        raise Skipped("node is not on PATH")
    npm = shutil.which("npm")
    if npm is None:
        raise Skipped("npm is not on PATH")
    lock = NODE_DIR / "package-lock.json"
    marker = NODE_DIR / "node_modules" / ".bench-lock"
    wanted = lock.read_text()
    if not reinstall and marker.exists() and marker.read_text() == wanted:
        return Path(node)
    log(f"npm ci in {NODE_DIR.relative_to(ROOT)} (bullmq, ioredis from package-lock.json)")
    ENVS.mkdir(parents=True, exist_ok=True)
    install_log = ENVS / "bullmq-node-install.log"
    with install_log.open("w") as out:
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"npm ci for bullmq-node failed; see {install_log}")
    marker.write_text(wanted)
    return Path(node)


def ensure_system(spec: SystemSpec, *, reinstall: bool = False) -> Path:
    """The interpreter that runs *spec*'s script, its environment made ready first."""
    if spec.node:
        ensure_node_modules(reinstall=reinstall)
    if spec.env is None:
        return Path(sys.executable)
    return ensure_env(spec.env, reinstall=reinstall)


# --------------------------------------------------------------------------- redis


def has_unix_socket(url: str) -> bool:
    """Whether the server at *url* listens on a unix socket (``CONFIG GET unixsocket``)."""
    resp = Resp(url)
    try:
        reply = resp.call("CONFIG", "GET", "unixsocket")
    except Exception:  # a managed Redis may refuse CONFIG: then asyncq cannot find one either
        return False
    finally:
        resp.close()
    return bool(reply) and len(reply) == 2 and bool(reply[1])


PIN_MODES = ("apart", "shared")
"""``--pin``'s placements: the measured processes on cores of their own (``apart``, what
``--pin`` alone means) or on the server's (``shared``)."""


def pin_plan(mode: str = "apart") -> tuple[set[int], set[int]]:
    """``--pin``'s cores: the first usable one for redis-server; for everything measured
    (systems, redis-benchmark, the redis-py row) the others (*mode* ``apart``) or the
    server's own (``shared``).

    Unpinned, a client's CPU per round trip depends on where the scheduler put it: on the
    server's core it waits without its core going idle, on a core of its own it pays to
    be woken (measured in issue 40: 8-10 µs a round trip more on one VM, 25-80 µs on
    others), and the scheduler picks again every round. Pinned, every system gets one
    case, always: ``apart`` is the deployment's (a server has cores of its own), and
    ``shared`` leaves out the wake-up, so a client's CPU is what its own code costs.
    """
    if mode not in PIN_MODES:
        raise SystemExit(f"--pin is one of {', '.join(PIN_MODES)}, not {mode!r}")
    usable = sorted(os.sched_getaffinity(0))
    if mode == "shared":
        return {usable[0]}, {usable[0]}
    if len(usable) < 2:
        raise SystemExit(f"--pin needs two usable cores; this process has {len(usable)}")
    return {usable[0]}, set(usable[1:])


def _start_server(
    binary: str, port: int, workdir: str, unix_socket: bool
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--daemonize", "no", "--loglevel", "warning",
         # A local Redis usually has a unix socket too: the asyncq-socket row opts in to it;
         # every other row, asyncq's headline one included, is on TCP.
         *(("--unixsocket", os.path.join(workdir, "redis.sock"), "--unixsocketperm", "700")
           if unix_socket else ())],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


@contextlib.contextmanager
def redis_server(
    url: str | None, *, unix_socket: bool = True, cpus: set[int] | None = None
) -> Iterator[str]:
    """*url* as given, or a throwaway redis-server on a free port (no persistence), on
    *cpus* when given (its threads too: the affinity is set before it starts them)."""
    if url:
        if cpus is not None:
            raise SystemExit("--pin places the throwaway redis-server: leave out --redis-url")
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
    if cpus is None:
        proc = _start_server(binary, port, workdir, unix_socket)
    else:
        own = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)  # the server inherits this process's cores: its threads too
        try:
            proc = _start_server(binary, port, workdir, unix_socket)
        finally:
            os.sched_setaffinity(0, own)
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
    spec: SystemSpec,
    python: Path,
    url: str,
    passthrough: Sequence[str],
    timeout: float,
    *,
    root: Path = ROOT,
) -> dict[str, Any]:
    """Run one system script; its records by phase, plus ``error`` when it failed.

    *root* is the directory that holds the ``benchmarks`` package the script is run from
    (its working directory and PYTHONPATH): :mod:`benchmarks.ab` gives a copy of it
    without ``asyncq`` beside it, so that the revision installed in *python*'s
    environment is the one imported.
    """
    resp = Resp(url)
    resp.call("FLUSHDB")
    resp.close()
    cmd = [str(python), "-m", f"benchmarks.systems.{spec.module}", "--url", url, *passthrough]
    if spec.variant:
        cmd += ["--variant", spec.variant]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(root), env.get("PYTHONPATH"))))
    records: dict[str, Any] = {}
    started = time.monotonic()
    # its own session, so that a hung system can be killed together with its worker processes
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
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


def run_reference(
    url: str, sizes: dict[str, int], timeout: float, latency: Config | None = None
) -> dict[str, Any]:
    """``redis-benchmark -t set`` with 1 and 32 clients against *url*, as two enqueue
    records (``enqueue_serial``, ``enqueue_c32``) with *sizes* requests each; with
    *latency*, also one Pub/Sub hop between two processes on the latency phase's
    cadence (:mod:`benchmarks.pubsub_probe`), as the ``latency`` record.

    Raises :class:`Skipped` when redis-benchmark is not on PATH.
    """
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise Skipped("redis-benchmark is not on PATH (Debian: apt-get install redis-tools)")
    parts = urlsplit(url)
    base = [binary, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379),
            "--dbnum", parts.path.lstrip("/") or "0", "-t", "set", "--csv"]  # fmt: skip
    if parts.password:
        base += ["-a", unquote(parts.password)]
        if parts.username:
            base += ["--user", unquote(parts.username)]
    records: dict[str, Any] = {
        "meta": {
            "phase": "meta",
            "system": REFERENCE,
            "versions": {REFERENCE: _tool_version(binary)},
            # without the password, which -a would have shown
            "command": "redis-benchmark " + " ".join(base[1:10]),
        }
    }
    error: str | None = None
    for phase, clients in REFERENCE_CLIENTS.items():
        n = sizes[phase]
        cmd = [*base, "-c", str(clients), "-n", str(n)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            error = f"{phase}: redis-benchmark killed after {timeout:.0f} s"
            break
        row = _parse_benchmark_csv(proc.stdout)
        if proc.returncode != 0 or row is None:
            detail = proc.stderr.strip()[:200]
            error = f"{phase}: redis-benchmark exited {proc.returncode}: {detail}"
            break
        records[phase] = {
            "phase": phase,
            "n": n,
            "callers": clients,
            "tasks_per_s": row["rps"],
            "p50_ms": row["p50_latency_ms"],
            "p99_ms": row["p99_latency_ms"],
            "command": f"redis-benchmark -t set -c {clients} -n {n}",
        }
    resp = Resp(url)
    resp.call("FLUSHDB")  # its key:__rand_int__
    resp.close()
    if error is None:
        for phase, rec in records.items():
            if phase != "meta":
                log(f"  {REFERENCE}: SET, {rec['callers']} client(s): {rec['tasks_per_s']:,.0f}/s")
    if error is None and latency is not None:
        try:
            hop = probe(url, latency.latency_n, latency.latency_interval_ms, latency.latency_warmup)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            error = f"latency: the Pub/Sub probe failed: {exc}"
        else:
            records["latency"] = hop
            log(f"  {REFERENCE}: one Pub/Sub hop p50 {hop['p50_ms']:.2f} ms, "
                f"p99 {hop['p99_ms']:.2f} ms")  # fmt: skip
    return {"system": REFERENCE, "records": records, "error": error}


def run_redispy_set(
    url: str, n: int, python: Path, harness_root: Path, timeout: float
) -> tuple[dict[str, Any] | None, str | None]:
    """:mod:`benchmarks.redispy_set` run by *python* (an environment with redis-py): a
    plain redis-py asyncio ``SET`` *n* times, one awaited at a time, and the event loop's
    floor; its record, or what failed."""
    env = dict(os.environ, PYTHONPATH=str(harness_root))
    try:
        proc = subprocess.run(
            [str(python), "-m", "benchmarks.redispy_set", "--url", url, "--n", str(n)],
            cwd=harness_root, env=env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"redis-py SET killed after {timeout:.0f} s"
    if proc.returncode != 0 or not proc.stdout.strip():
        return None, f"redis-py SET exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
    rec: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    log(
        f"  redis-py SET: {rec['tasks_per_s']:,.0f}/s,"
        f" {rec['client_cpu_us_per_task']:.1f} µs CPU/call;"
        f" the event loop's floor {rec['floor_cpu_us_per_call']:.1f} µs CPU/call"
    )
    return rec, None


def _parse_benchmark_csv(text: str) -> dict[str, float] | None:
    """The SET line of ``redis-benchmark --csv`` (header line, then one line per test)."""
    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    if len(rows) < 2:
        return None
    header = rows[0]
    for row in rows[1:]:
        if row and row[0] == "SET" and len(row) == len(header):
            try:
                return {k: float(v) for k, v in zip(header[1:], row[1:], strict=True)}
            except ValueError:
                return None
    return None


def _tool_version(binary: str) -> str:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    match = re.search(r"\d+\.\d+\.\d+", out)
    return match.group(0) if match else out.strip() or "?"


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
    fmt: str  # "rate", "ms", "count" (signed), "int", "float", "us", "ratio"
    ratio: bool = False


def _field(phase: str, key: str) -> Callable[[dict[str, Any]], float | None]:
    def get(records: dict[str, Any]) -> float | None:
        value = records.get(phase, {}).get(key)
        return None if value is None else float(value)

    return get


def _to_reference(phase: str) -> Callable[[dict[str, Any]], float | None]:
    """A system's tasks/s in *phase* divided by the reference's in the same round."""

    def get(records: dict[str, Any]) -> float | None:
        ours = records.get(phase, {}).get("tasks_per_s")
        ref = records.get(_REF_KEY, {}).get(phase, {}).get("tasks_per_s")
        if ours is None or not ref or records.get("meta", {}).get("system") == REFERENCE:
            return None
        return float(ours) / float(ref)

    return get


def _over_reference(
    phase: str, field: str, ref_phase: str | None = None, ref_field: str | None = None
) -> Callable[[dict[str, Any]], float | None]:
    """A system's *field* of *phase* divided by the reference's (its *ref_field* of
    *ref_phase*, by default the same) in the same round: how many physical hops' worth a
    pickup takes, or a serial enqueue's client CPU over a redis-py ``SET``'s."""

    def get(records: dict[str, Any]) -> float | None:
        ours = records.get(phase, {}).get(field)
        ref = records.get(_REF_KEY, {}).get(ref_phase or phase, {}).get(ref_field or field)
        if ours is None or not ref or records.get("meta", {}).get("system") == REFERENCE:
            return None
        return float(ours) / float(ref)

    return get


_REF_KEY = "_reference"
"""Where :func:`summarize` puts the same round's reference records beside a system's."""
_FAST, _SERIAL, _PROC, _LAT, _LEFT = (
    "enqueue_fast",
    "enqueue_serial",
    "process",
    "latency",
    "leftovers",
)
SERIAL_RATIO = "enqueue, serial ÷ redis-benchmark SET, 1 client"
C32_RATIO = "enqueue, 32 callers ÷ redis-benchmark SET, 32 clients"
PICKUP_RATIO = "pickup p50 ÷ one Pub/Sub hop p50"
CLIENT_CPU_RATIO = "client CPU, serial enqueue ÷ redis-py SET's"
REDISPY = "redispy_set"
"""The reference's record of a plain redis-py asyncio ``SET`` (:mod:`benchmarks.redispy_set`)."""
ROWS = (
    Row("enqueue, fast path, tasks/s ¹", _field(_FAST, "tasks_per_s"), "rate", True),
    Row("enqueue, serial `await`, tasks/s", _field(_SERIAL, "tasks_per_s"), "rate", True),
    Row(SERIAL_RATIO, _to_reference(_SERIAL), "ratio"),
    Row("enqueue, serial, p99 ms per call", _field(_SERIAL, "p99_ms"), "ms"),
    Row("enqueue, 32 callers, tasks/s", _field("enqueue_c32", "tasks_per_s"), "rate", True),
    Row(C32_RATIO, _to_reference("enqueue_c32"), "ratio"),
    Row("enqueue, 32 callers, p99 ms per call", _field("enqueue_c32", "p99_ms"), "ms"),
    Row("enqueue, 1,000 callers, tasks/s", _field("enqueue_c1000", "tasks_per_s"), "rate", True),
    Row("enqueue, 1,000 callers, p99 ms per call", _field("enqueue_c1000", "p99_ms"), "ms"),
    Row("client CPU µs / task, serial enqueue", _field(_SERIAL, "client_cpu_us_per_task"), "us"),
    Row("redis-py asyncio SET, client CPU µs / call ⁵", _field(REDISPY, "client_cpu_us_per_task"),
        "us"),
    Row(CLIENT_CPU_RATIO, _over_reference(_SERIAL, "client_cpu_us_per_task", REDISPY,
                                          "client_cpu_us_per_task"), "ratio"),
    Row("process, 1 worker, conc. 100, tasks/s", _field(_PROC, "tasks_per_s"), "rate", True),
    Row("pickup latency p50, ms", _field(_LAT, "p50_ms"), "ms"),
    Row("pickup latency p99, ms", _field(_LAT, "p99_ms"), "ms"),
    Row(PICKUP_RATIO, _over_reference(_LAT, "p50_ms"), "ratio"),
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
ROW_BY_LABEL = {row.label: row for row in ROWS}


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
    if kind == "ratio":
        return f"{value:.2f}×"
    return f"{value:,.0f}"


def summarize(runs: Sequence[dict[str, dict[str, Any]]], systems: Sequence[str]) -> dict[str, Any]:
    """Per system and row: all values over the runs, median, min, max.

    A ratio to the reference is taken within each round (the system's value over the
    reference's in the same round), then summarized like any other row.
    """
    out: dict[str, Any] = {}
    for name in systems:
        rows: dict[str, Any] = {}
        for row in ROWS:
            values = []
            for run in runs:
                if name not in run or run[name]["error"]:
                    continue
                ref = run.get(REFERENCE)
                records = run[name]["records"] | {
                    _REF_KEY: ref["records"] if ref and not ref["error"] else {}
                }
                if (v := row.get(records)) is not None:
                    values.append(v)
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


def _peers(systems: Sequence[str]) -> list[str]:
    """The systems asyncq is compared with: not itself on its socket, not the reference."""
    return [s for s in systems if s not in ("asyncq", "asyncq-socket", REFERENCE)]


def render_table(summary: dict[str, Any], systems: Sequence[str], n_runs: int) -> str:
    """Every row, one column per system (the reference's column where it has a value)."""
    peers = _peers(systems)
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
    lines += ["", _footnote(n_runs)]
    return "\n".join(lines)


def _footnote(n_runs: int) -> str:
    note = "median (min–max) of " + str(n_runs) + " runs" if n_runs > 1 else "one run"
    return (
        f"Cells: {note}. ¹ asyncq: `Client.enqueue_many`, streaq: `Worker.enqueue_many`, "
        "BullMQ: `Queue.addBulk` (one pipeline); arq, saq, taskiq: 32 concurrent `enqueue` "
        "calls (`asyncio.gather`). ² serial phase, `INFO commandstats` incl. commands run "
        "inside Lua. ³ after the worker shut down; see the leftovers section for what they are. "
        "⁵ in the reference column: a plain redis-py asyncio `SET`, one awaited at a time, "
        "with the serial phase's N (`python -m benchmarks.redispy_set`), what every asyncio "
        "client built on redis-py pays per round trip. "
        "Ratios to the reference are taken within each round, then summarized."
    )


def system_label(spec: SystemSpec, records: dict[str, Any]) -> str:
    """``saq 0.26.4``: the label (or name) and the library's version, when it names one."""
    versions = records.get("meta", {}).get("versions", {})
    version = versions.get(spec.version_key or spec.module, "")
    if spec.name == "asyncq":
        version = versions.get("asyncq-git", version)
    return f"{spec.label or spec.name} {version}".strip()


HEADLINE = (
    ("enqueue, serial, tasks/s", "enqueue, serial `await`, tasks/s"),
    ("÷ SET 1 client", SERIAL_RATIO),
    ("enqueue, 32 callers, tasks/s", "enqueue, 32 callers, tasks/s"),
    ("÷ SET 32 clients", C32_RATIO),
    ("process, 1 worker, conc. 100, tasks/s", "process, 1 worker, conc. 100, tasks/s"),
    ("pickup p50 ms", "pickup latency p50, ms"),
    ("pickup p99 ms", "pickup latency p99, ms"),
    ("÷ 1 hop", PICKUP_RATIO),
    ("worker CPU µs / task", "worker CPU µs / task"),
    ("lost", "tasks never run (lost)"),
    ("extra runs", "handler calls − N"),
)
"""The headline table's columns: (heading, the row of :data:`ROWS` it shows)."""


def render_headline(
    summary: dict[str, Any],
    systems: Sequence[str],
    labels: dict[str, str],
    transports: dict[str, str],
) -> str:
    """One row per system, the reference row first: the table the README shows."""
    header = ["system", "to Redis", *(h for h, _ in HEADLINE)]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * len(HEADLINE)]
    for name in (REFERENCE, *[s for s in systems if s != REFERENCE]):
        if name not in summary:
            continue
        cells = [labels.get(name, name), transports.get(name, "TCP")]
        for _, label in HEADLINE:
            row = ROW_BY_LABEL[label]
            stats = summary[name].get(label)
            if name == REFERENCE and row.fmt == "ratio" and stats is None:
                cells.append("1.00×")
            else:
                cells.append(_cell(stats, row.fmt))
        lines.append("| " + " | ".join(cells) + " |")
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


def git_commit() -> str:
    """The checkout's commit (``git describe --always --dirty``), or ``?`` outside git."""
    try:
        proc = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT, capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "?"
    return proc.stdout.strip() or "?"


def pin(server: set[int] | None, measured: set[int] | None) -> dict[str, list[int]] | None:
    """Put this process, and so every process it starts from now on, on the *measured*
    cores (``--pin``; None: nothing to do); what was pinned, for the record."""
    if server is None or measured is None:
        return None
    os.sched_setaffinity(0, measured)
    return {"redis-server": sorted(server), "measured": sorted(measured)}


@contextlib.contextmanager
def measured_server(
    url: str | None, *, pin_mode: str | None, unix_socket: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server the rounds measure (*url*, or a throwaway one: see ``redis_server``) and
    the machine they run on. With a *pin_mode* (``--pin``, see :func:`pin_plan`), the
    server gets the first usable core and this process, so every process it starts from
    then on, the measured cores."""
    server_cpus, measured_cpus = pin_plan(pin_mode) if pin_mode else (None, None)
    with redis_server(url, unix_socket=unix_socket, cpus=server_cpus) as served:
        machine = machine_info(served)  # the cores usable before pin() narrows this process's
        if (pinned := pin(server_cpus, measured_cpus)) is not None:
            machine["pinned"] = pinned
        yield served, machine


def machine_info(url: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(AttributeError, OSError):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        info["memory_gib"] = round(mem_kb / 2**20, 1)
    with contextlib.suppress(OSError):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    # Set, every Python process compiles what it imports from source: a module first
    # imported after a worker's CPU meter started counts against its CPU per task.
    info["pythondontwritebytecode"] = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    resp = Resp(url)
    server = resp.info("server")
    resp.close()
    info["redis_version"] = server.get("redis_version")
    return info


# --------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "asyncq beside arq, saq, streaq, taskiq and BullMQ (Python and Node) on one "
            "throwaway Redis, every system over TCP, with redis-benchmark SET and one "
            "Pub/Sub hop as the physical reference."
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small N for a smoke run (default systems: " + ",".join(DEFAULT_QUICK_SYSTEMS) + ")",
    )
    p.add_argument(
        "--systems",
        help=f"comma-separated, from {','.join(SYSTEMS)} (default: {','.join(DEFAULT_SYSTEMS)})",
    )
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
        help="the throwaway Redis listens on TCP only (no asyncq-socket row)",
    )
    p.add_argument(
        "--no-reference", action="store_true", help="leave out the redis-benchmark reference"
    )
    p.add_argument(
        "--reinstall", action="store_true", help="recreate the peer virtualenvs and node_modules"
    )
    p.add_argument("--n", type=int, help="tasks for fast-path enqueue and processing (20000)")
    p.add_argument("--serial-n", type=int, help="tasks for serial enqueue (5000)")
    p.add_argument("--latency-n", type=int, help="pickup latency samples (200)")
    p.add_argument("--concurrency", type=int, help="worker concurrency (100)")
    p.add_argument("--batch-size", type=int, help="tasks per batch-API call (0 = all at once)")
    p.add_argument("--settle", type=float, help="seconds to wait for late duplicate runs (1.0)")
    p.add_argument(
        "--pin",
        nargs="?",
        const="apart",
        choices=PIN_MODES,
        help="redis-server on the first usable core, every measured process on the others"
        " (apart, the default) or on the server's core too (shared)",
    )
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


REFERENCE_MIN_REQUESTS = {"enqueue_serial": 20_000, "enqueue_c32": 100_000}
"""Outside ``--quick``, the reference makes at least this many requests (about a second
each here): a window of a few hundred milliseconds is at the mercy of one scheduling
hiccup on a shared machine, and the reference divides every system's rate."""


def _run_config(args: argparse.Namespace, url: str) -> Config:
    """The run's sizes (``--quick`` or full, with ``--n``, ``--serial-n`` and
    ``--latency-n`` where given), as every system's script gets them."""
    names = ("n", "serial_n", "latency_n")
    over = {k: v for k in names if (v := getattr(args, k, None)) is not None}
    return Config.quick(url, **over) if args.quick else Config(url=url, **over)


def _sizes(args: argparse.Namespace, url: str) -> dict[str, int]:
    """Requests per reference measurement: the N of the enqueue phase it stands beside,
    raised to :data:`REFERENCE_MIN_REQUESTS` outside ``--quick``."""
    cfg = _run_config(args, url)
    sizes = {"enqueue_serial": cfg.serial_n, "enqueue_c32": cfg.n}
    if not args.quick:
        sizes = {k: max(v, REFERENCE_MIN_REQUESTS[k]) for k, v in sizes.items()}
    return sizes


def _default_json() -> Path:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    path = RESULTS / f"{stamp}.json"
    if path.exists():
        path = RESULTS / f"{stamp}-{datetime.now(UTC).strftime('%H%M%S')}.json"
    return path


def command_line(argv: Sequence[str] | None) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    return " ".join(["python -m benchmarks", *args])


def render_heading(
    started: datetime,
    machine: dict[str, Any],
    *,
    command: str,
    commit: str,
    n: object,
    quick: bool,
) -> str:
    cpus = machine.get("cpus")
    usable = machine.get("cpus_usable")
    nproc = f"{usable} of {cpus}" if usable and usable != cpus else f"{cpus}"
    load = machine.get("load_average")
    lines = [
        f"asyncq benchmark, {started:%Y-%m-%d %H:%M} UTC"
        + (" — SMOKE RUN (--quick): the figures are not results" if quick else ""),
        f"machine: nproc {nproc}, {machine.get('cpu_model', '?')},"
        f" {machine.get('memory_gib', '?')} GiB memory, Linux {machine['kernel']}"
        + (f", load average {' '.join(str(x) for x in load)} at the start" if load else ""),
        *pinned_lines(machine),
        f"Python {machine['python']}"
        + (" (PYTHONDONTWRITEBYTECODE set)" if machine.get("pythondontwritebytecode") else "")
        + f", redis-server {machine['redis_version']} (one server, every"
        f" system over TCP unless its row says otherwise), N = {n}",
        f"command: {command}",
        f"commit: {commit}",
    ]
    return "\n".join(lines)


def pinned_lines(machine: dict[str, Any]) -> list[str]:
    """The heading's line saying where ``--pin`` put the processes (none when unpinned)."""
    pinned = machine.get("pinned")
    if not pinned:
        return []
    server, measured = (",".join(map(str, pinned[k])) for k in ("redis-server", "measured"))
    if server == measured:
        return [
            f"pinned (--pin shared): redis-server and every measured process on CPU {server},"
            " so no client pays to be woken on a core of its own (see benchmarks/README.md)"
        ]
    return [
        f"pinned (--pin): redis-server on CPU {server}, every measured process on CPU {measured}"
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    systems: list[str] = args.system_list
    pythons: dict[str, Path] = {}
    setup_errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name in systems:
        try:
            pythons[name] = ensure_system(SYSTEMS[name], reinstall=args.reinstall)
        except Skipped as exc:
            skipped[name] = str(exc)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            setup_errors[name] = f"environment setup failed: {exc}"
            log(f"{name}: {setup_errors[name]}")
    timeout = 180.0 if args.quick else 1800.0
    started = datetime.now(UTC)
    runs: list[dict[str, dict[str, Any]]] = []
    with_reference = not args.no_reference
    with measured_server(
        args.redis_url, pin_mode=args.pin, unix_socket=not args.no_unix_socket
    ) as (url, machine):
        if "asyncq-socket" in systems and not has_unix_socket(url):
            skipped["asyncq-socket"] = "the Redis server has no unix socket"
        if with_reference and shutil.which("redis-benchmark") is None:
            skipped[REFERENCE] = "redis-benchmark is not on PATH (Debian: redis-tools)"
            with_reference = False
        for name, reason in skipped.items():
            log(f"skipped {name}: {reason}")
        systems = [s for s in systems if s not in skipped]
        sizes = _sizes(args, url)
        # The serial enqueue's own N, not the reference's raised minimum: CPU per call is
        # what the redis-py row is for. Measured by this Python, which needs redis-py.
        redispy: int | None = _run_config(args, url).serial_n
        if with_reference and importlib.util.find_spec("redis") is None:
            log("skipped the redis-py SET row: redis-py is not installed in this Python")
            redispy = None
        for k in range(args.runs):
            run: dict[str, dict[str, Any]] = {}
            if with_reference:
                log(f"run {k + 1}/{args.runs}: {REFERENCE}")
                run[REFERENCE] = run_reference(url, sizes, timeout, _run_config(args, url))
                if run[REFERENCE]["error"]:
                    log(f"  {REFERENCE} FAILED: {run[REFERENCE]['error']}")
                elif redispy is not None:
                    rec, error = run_redispy_set(url, redispy, Path(sys.executable), ROOT, timeout)
                    if rec is not None:
                        run[REFERENCE]["records"][REDISPY] = rec
                    else:
                        log(f"  {error}")
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
    columns = systems + ([REFERENCE] if with_reference else [])
    summary = summarize(runs, columns)
    labels = {s: system_label(SYSTEMS[s], runs[-1][s]["records"]) for s in systems}
    labels[REFERENCE] = "redis-benchmark SET, one Pub/Sub hop (physical reference)"
    transports = {s: "unix socket" if s == "asyncq-socket" else "TCP" for s in columns}
    headline = render_headline(summary, systems, labels, transports)
    table = render_table(summary, columns, args.runs)
    leftovers = render_leftovers([runs[-1][s] for s in systems])
    versions = {s: runs[-1][s]["records"].get("meta", {}).get("versions", {}) for s in columns}
    command = command_line(argv)
    commit = git_commit()
    heading = render_heading(
        started,
        machine,
        command=command,
        commit=commit,
        n=_first(runs, systems, "process", "n"),
        quick=args.quick,
    )
    print(heading)
    print("versions: " + "; ".join(f"{s} {json.dumps(v)}" for s, v in versions.items()))
    for name, reason in skipped.items():
        print(f"skipped: {name}: {reason}")
    print()
    print(headline)
    print()
    print(headline_notes(args.runs, with_reference))
    print()
    print(table)
    print()
    print(leftovers)
    failures = [
        f"{s}: {runs[k][s]['error']}"
        for k in range(len(runs))
        for s in columns
        if runs[k][s]["error"]
    ]
    out_path = args.json or _default_json()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "schema": 2,
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "machine": machine,
        "command": command,
        "commit": commit,
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "systems": systems,
        "skipped": skipped,
        "runs": runs,
        "summary": summary,
        "headline": headline,
        "table": table,
        "failures": failures,
    }
    out_path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    log(f"wrote {out_path}")
    status = 0
    if failures:
        log("failed: " + "; ".join(failures))
        status = 1
    bad = [
        f"{name} run {k + 1} {phase}: handler calls − N = {r['handler_calls_minus_n']},"
        f" lost = {r['lost']}"
        for name in ("asyncq", "asyncq-socket")
        if name in systems
        for k, run in enumerate(runs)
        for phase in ("process", "latency")
        if (r := run[name]["records"].get(phase)) and (r["handler_calls_minus_n"] or r["lost"])
    ]
    if bad:
        log("asyncq correctness check failed: " + "; ".join(bad))
        status = 1
    return status


def headline_notes(n_runs: int, with_reference: bool) -> str:
    note = f"median (min–max) of {n_runs} interleaved rounds" if n_runs > 1 else "one round"
    text = (
        f"Cells: {note}. Every system is given the same TCP URL of one redis-server and runs"
        " with its defaults (one worker process, concurrency 100). ⁴ asyncq again, with its"
        " opt-in `?local_socket=true` (its hot-path connections on the server's unix socket):"
        " not like for like, so it is an extra row and in no ratio."
    )
    if with_reference:
        text += (
            " The reference row is `redis-benchmark -t set` with 1 and with 32 clients (the"
            " N of the serial and the 32-caller enqueue, at least 20,000 and 100,000 requests"
            " outside --quick), run at the start of every round. One client waiting for each"
            " reply is this machine's round-trip limit, which a serial enqueue cannot beat;"
            " 32 clients is what Redis serves to 32 connections that each wait for their"
            " reply (one pipelining producer can pass it). A system's ratio is its enqueue"
            " rate over the reference's in the same round."
        )
    return text


def _first(
    runs: Sequence[dict[str, dict[str, Any]]], systems: Sequence[str], phase: str, key: str
) -> Any:
    for run in runs:
        for s in systems:
            value = run[s]["records"].get(phase, {}).get(key)
            if value is not None:
                return value
    return "?"
