"""Developer tasks: ``nox`` runs tests, lint and typecheck (what CI runs)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
ROOT = Path(__file__).parent


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite against throwaway redis-server processes."""
    session.install("-e", ".[dev]")
    args = session.posargs or ["-n", "2", "--dist", "loadgroup"]
    session.run("pytest", *args)


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
def proto(session: nox.Session) -> None:
    """Regenerate asyncq/proto from protos/asynq.proto with betterproto2_compiler."""
    session.install("betterproto2_compiler>=0.10,<0.11", "grpcio-tools>=1.60")
    out = ROOT / "asyncq" / "proto"
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as gen:
        # The compiler formats its output with the ruff settings of the working
        # directory; an empty ruff.toml gives ruff's defaults, which the committed
        # code (and the drift test in tests/test_proto.py) uses.
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
    """Benchmarks against the Python peers (see benchmarks/README.md)."""
    session.install("-e", ".[uvloop]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=PYTHON)
def chaos(session: nox.Session) -> None:
    """Chaos scenarios on real redis-servers and worker processes (``-- --quick`` for CI)."""
    session.install("-e", ".")
    session.run("python", "-m", "chaos", *session.posargs)
