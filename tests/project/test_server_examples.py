"""The runnable examples in examples/ work end to end against a real Redis."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from redis.asyncio import Redis

from tests.support.procs import ROOT
from tests.support.redis_server import free_port

pytestmark = pytest.mark.subprocess


def run_example(name: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ASYNCQ_REDIS_URL": url, "PORT": "0"}
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("main_job.py", (), "made 12 thumbnails"),
        ("webapp.py", ("--self-test",), "worker: welcome email sent to ada@example.com"),
        ("aggregation.py", (), "digest for user-2: 2 notifications"),
        ("durable_onboarding.py", (), "user 2: opened=False, score 90"),
        ("durable_agent.py", (), "T-2: A refund for the kettle was declined"),
    ],
)
async def test_example_runs(
    redis: Redis, redis_url: str, name: str, args: tuple[str, ...], expected: str
) -> None:
    result = run_example(name, redis_url, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout


@pytest.mark.parametrize(
    "name",
    ["main_job.py", "webapp.py", "aggregation.py", "durable_onboarding.py", "durable_agent.py"],
)
def test_example_reports_unreachable_redis(name: str) -> None:
    result = run_example(name, f"redis://127.0.0.1:{free_port()}/0", "--self-test")
    assert result.returncode == 1
    assert "error:" in result.stderr and "Traceback" not in result.stderr
