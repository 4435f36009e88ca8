"""Smoke test of an installed asyncq (run by ``nox -s wheel`` in a clean virtualenv).

Run with the virtualenv's python from a directory outside the source tree, so
that ``import asyncq`` finds the installed package. Checks the version, the
CLI, the lean install (no optional packages pulled in, the dashboard naming
its extra) and one task enqueued and processed against a throwaway server
started here with the installed ``asyncq.devserver`` (redis-server from PATH,
else the Valkey of the ``embedded`` extra). Exits non-zero with a message on any failure.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

EXPECTED_VERSION = sys.argv[1] if len(sys.argv) > 1 else None
BIN = Path(sys.executable).parent


def check(condition: bool, message: str) -> None:
    if not condition:
        sys.exit(f"smoke test failed: {message}")


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "asyncq"), *args], capture_output=True, text=True, check=False, **kwargs
    )  # type: ignore[call-overload]


APP = """
from asyncq import ServeMux, Task

mux = ServeMux()

@mux.handler("smoke:echo")
async def echo(task: Task) -> None:
    await task.result_writer.write(task.payload.upper())
"""


async def enqueue_and_read(url: str, work: Path) -> None:
    from datetime import timedelta

    from asyncq import Client, Inspector, Task, TaskState

    async with Client(url) as client:
        info = await client.enqueue(Task("smoke:echo", b"hello"), retention=timedelta(minutes=1))
    check(info.state is TaskState.PENDING, f"enqueued task is {info.state}")
    worker = run("-u", url, "worker", "smokeapp:mux", "--burst", "--log-level", "warning", cwd=work)
    check(worker.returncode == 0, f"asyncq worker --burst failed: {worker.stderr}")
    async with Inspector(url) as inspector:
        done = await inspector.get_task("default", info.id)
    check(done.state is TaskState.COMPLETED, f"task ended {done.state}")
    check(done.result == b"HELLO", f"task result {done.result!r}")


def main() -> None:
    import asyncq

    location = Path(asyncq.__file__).resolve()
    check("site-packages" in location.parts, f"asyncq imported from {location}, not installed")
    if EXPECTED_VERSION is not None:
        check(asyncq.__version__ == EXPECTED_VERSION, f"version {asyncq.__version__}")
    check((location.parent / "py.typed").exists(), "py.typed is missing")

    version = run("--version")
    check(version.returncode == 0, f"asyncq --version failed: {version.stderr}")
    check(version.stdout.strip() == f"asyncq, version {asyncq.__version__}", version.stdout)

    for optional in ("textual", "uvloop", "watchfiles"):
        check(importlib.util.find_spec(optional) is None, f"the core install pulled in {optional}")
    dash = run("-u", "redis://127.0.0.1:1/0", "dash")
    check(dash.returncode == 1, "asyncq dash without textual did not fail")
    check("pip install 'asyncq[dash]'" in dash.stderr, f"dash error: {dash.stderr}")

    # The installed package's own dev server: redis-server from PATH, else the embedded
    # extra's Valkey (nox installs the artifact with [embedded]).
    from asyncq.devserver import LocalServer, ServerNotFoundError

    try:
        server = LocalServer()
    except ServerNotFoundError as exc:
        sys.exit(f"smoke test failed: {exc}")
    with tempfile.TemporaryDirectory() as work, server:
        (Path(work) / "smokeapp.py").write_text(APP)
        asyncio.run(enqueue_and_read(server.url, Path(work)))
    print(f"smoke test passed: asyncq {asyncq.__version__} from {location.parent}")


if __name__ == "__main__":
    os.environ.pop("ASYNCQ_REDIS_URL", None)
    main()
