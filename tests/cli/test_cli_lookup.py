"""``asyncq task inspect ID`` and ``asyncq workflow inspect|cancel ID`` (issue 41, item 7).

The ID is an argument (``-i ID`` still works), found in any queue when ``-q`` is
left out, and may be its start: the 8 characters the web UI, ``asyncq dash`` and
the events show of a UUID. An ambiguous start is an error naming the candidates;
nothing found is an error naming the ID.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis as sync_redis
from click.testing import CliRunner, Result

from asyncq import Client, Task, chain
from asyncq.cli import main

ROOT = Path(__file__).resolve().parents[2]

# Two tasks sharing their first 8 characters, one alone, and one ID in two queues.
TWIN_A = "abcdef12-0000-4000-8000-000000000001"
TWIN_B = "abcdef12-0000-4000-8000-000000000002"
ALONE = "7f3e2d1c-0000-4000-8000-000000000003"
BOTH = "shared-id"


@pytest.fixture
def cli(redis_url: str, tmp_path: Path) -> Callable[..., Result]:
    client = sync_redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()

    async def seed() -> None:
        async with Client(redis_url) as c:
            await c.enqueue(Task("t:a"), task_id=TWIN_A)
            await c.enqueue(Task("t:b"), task_id=TWIN_B, queue="critical")
            await c.enqueue(Task("t:alone"), task_id=ALONE, queue="critical")
            await c.enqueue(Task("t:both"), task_id=BOTH)
            await c.enqueue(Task("t:both"), task_id=BOTH, queue="critical")
            await chain(Task("s1"), Task("s2")).enqueue(c, workflow_id="report-2026-11-28-a")
            await chain(Task("s1"), Task("s2")).enqueue(c, workflow_id="report-2026-11-28-b")
            await chain(Task("s1", queue="critical"), Task("s2")).enqueue(
                c, workflow_id="cleanup-7"
            )

    asyncio.run(seed())
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None, "COLUMNS": "80"})

    def invoke(*args: str) -> Result:
        return runner.invoke(main, ["-u", redis_url, *args], catch_exceptions=False)

    return invoke


def error_line(result: Result) -> str:
    assert result.exit_code != 0, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.output
    return line


def inspected_id(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["id"])


def test_task_inspect_takes_the_id_as_an_argument_in_any_queue(cli: Callable[..., Result]) -> None:
    out = cli("task", "inspect", ALONE)  # in "critical", not named
    assert out.exit_code == 0, out.output
    assert ALONE in out.stdout and "critical" in out.stdout
    assert inspected_id(cli("task", "inspect", ALONE, "--json")) == ALONE
    # The older spelling still works, with or without the queue.
    assert inspected_id(cli("task", "inspect", "-q", "critical", "-i", ALONE, "--json")) == ALONE
    assert inspected_id(cli("task", "inspect", "--id", ALONE, "--json")) == ALONE


def test_task_inspect_takes_the_short_id_the_web_ui_shows(cli: Callable[..., Result]) -> None:
    assert inspected_id(cli("task", "inspect", ALONE[:8], "--json")) == ALONE
    assert inspected_id(cli("task", "inspect", "-q", "critical", ALONE[:8], "--json")) == ALONE
    # The twins share 8 characters: more of the ID, or the queue, tells them apart.
    assert inspected_id(cli("task", "inspect", TWIN_A, "--json")) == TWIN_A
    assert inspected_id(cli("task", "inspect", TWIN_B[:-2], "-q", "critical", "--json")) == TWIN_B


def test_an_ambiguous_or_unknown_id_is_an_error_naming_it(cli: Callable[..., Result]) -> None:
    line = error_line(cli("task", "inspect", TWIN_A[:8]))
    assert f"task ID '{TWIN_A[:8]}' is ambiguous" in line
    assert f"default/{TWIN_A}" in line and f"critical/{TWIN_B}" in line
    # One ID in two queues (asynq's IDs are unique per queue): the queue decides.
    line = error_line(cli("task", "inspect", BOTH))
    assert f"default/{BOTH}" in line and f"critical/{BOTH}" in line
    out = cli("task", "inspect", BOTH, "-q", "critical", "--json")
    assert json.loads(out.stdout)["queue"] == "critical"

    line = error_line(cli("task", "inspect", "0ddba11"))
    assert "task not found: id='0ddba11' in any queue" in line
    line = error_line(cli("task", "inspect", "-q", "default", ALONE[:8]))
    assert f"task not found: id='{ALONE[:8]}' queue='default'" in line
    assert "queue not found" in error_line(cli("task", "inspect", "-q", "nope", ALONE))
    assert "Missing argument 'ID'" in error_line(cli("task", "inspect"))
    assert "two IDs given" in error_line(cli("task", "inspect", ALONE, "-i", TWIN_A))
    assert "cannot be empty" in error_line(cli("task", "inspect", " "))
    assert "braces" in error_line(cli("task", "inspect", "foo}:pending"))


def test_workflow_inspect_and_cancel_find_the_workflow_by_id_or_its_start(
    cli: Callable[..., Result],
) -> None:
    out = cli("workflow", "inspect", "cleanup-7", "--json")  # under "critical", not named
    assert out.exit_code == 0, out.output
    assert (json.loads(out.stdout)["id"], json.loads(out.stdout)["queue"]) == (
        "cleanup-7",
        "critical",
    )
    out = cli("workflow", "inspect", "clean")
    assert out.exit_code == 0 and "Workflow:   cleanup-7" in out.stdout
    old = cli("workflow", "inspect", "-q", "default", "-i", "report-2026-11-28-a", "--json")
    assert json.loads(old.stdout)["id"] == "report-2026-11-28-a"

    line = error_line(cli("workflow", "inspect", "report-"))
    assert "workflow ID 'report-' is ambiguous" in line
    assert "default/report-2026-11-28-a" in line and "default/report-2026-11-28-b" in line
    line = error_line(cli("workflow", "cancel", "report-"))  # cancels nothing
    assert "ambiguous" in line
    line = error_line(cli("workflow", "inspect", "nightly"))
    assert "workflow not found: id='nightly' in any queue" in line

    out = cli("workflow", "cancel", "report-2026-11-28-b")
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == "Workflow report-2026-11-28-b canceled"
    out = cli("workflow", "cancel", "clean")
    assert out.stdout.strip() == "Workflow cleanup-7 canceled"
    # Without a retention a canceled workflow's record goes at once: "report-" is now
    # the start of one workflow only.
    assert "workflow not found" in error_line(cli("workflow", "inspect", "cleanup-7"))
    left = json.loads(cli("workflow", "inspect", "report-", "--json").stdout)
    assert (left["id"], left["state"]) == ("report-2026-11-28-a", "running")


@pytest.mark.subprocess
def test_the_real_command_takes_a_short_id(
    cli: Callable[..., Result], redis_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "ASYNCQ_REDIS_URL": redis_url, "HOME": str(tmp_path)}
    script = Path(sys.executable).with_name("asyncq")  # the installed command
    command = [str(script)] if script.exists() else [sys.executable, "-m", "asyncq.cli"]

    def inspect(task_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "task", "inspect", task_id],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=False,
        )

    done = inspect(ALONE[:8])
    assert done.returncode == 0, done.stderr
    assert f"ID:           {ALONE}" in done.stdout
    ambiguous = inspect(TWIN_A[:8])
    assert ambiguous.returncode == 1
    assert ambiguous.stderr.startswith(f"error: task ID '{TWIN_A[:8]}' is ambiguous")
