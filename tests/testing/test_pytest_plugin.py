"""asyncq's pytest plugin, used by a sample test module run with pytester (in this
process where a fresh one adds nothing: the plugin loads from its entry point either way)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "testing"


@pytest.fixture(autouse=True)
def ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def test_the_documented_example_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        tasks=(EXAMPLE / "tasks.py").read_text(), test_tasks=(EXAMPLE / "test_tasks.py").read_text()
    )
    # A process of its own: with -W error, pytest's warning that asyncq was imported
    # before it could rewrite asserts (as it is in this process) would fail the run.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-W", "error")
    result.assert_outcomes(passed=3)


def test_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--fixtures", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "*asyncq_redis_server*",
            "*asyncq_redis_url*",
            "*asyncq_client*",
            "*asyncq_worker*",
        ]
    )


def test_worker_fixture_times_out_naming_the_problem(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_slow="""
import asyncio
from datetime import timedelta

import pytest
from asyncq import Client, ServeMux, Task


@pytest.mark.asyncio
async def test_stuck(asyncq_worker, asyncq_client: Client) -> None:
    mux = ServeMux()

    async def forever(task: Task) -> None:
        await asyncio.sleep(60)

    mux.handle("slow", forever)
    await asyncq_client.enqueue(Task("slow"))
    with pytest.raises(TimeoutError, match="not empty after 0:00:00.500000"):
        await asyncq_worker(mux, within=timedelta(milliseconds=500),
                            shutdown_timeout=timedelta(seconds=1))
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)
