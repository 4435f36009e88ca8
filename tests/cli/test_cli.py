"""The ``asyncq`` command line through its real entry point (asyncq.cli:main).

Redis states are written the way Go asynq writes them (tests/support/gofixtures.py).
These tests are synchronous: the CLI runs its own event loop, as from a shell.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq._duration import parse_cli_duration
from asyncq.cli import main
from asyncq.cli._format import format_payload, parse_time, table
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask, GoWorker
from tests.support.helpers import same_day_now
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
ENTRY_ID = "7d3c9a6e-2b1f-4e8a-9f5d-0c1b2a3d4e5f"


def seed(url: str, fn: Callable[[Redis], Awaitable[Any]]) -> Any:
    async def go_() -> Any:
        r = Redis.from_url(url)
        try:
            return await fn(r)
        finally:
            await r.aclose()

    return asyncio.run(go_())


@pytest.fixture
def cli(redis_url: str, r: sync_redis.Redis, tmp_path: Path) -> Callable[..., Result]:
    """Invoke ``asyncq -u <test redis> ARGS`` in an 80-column terminal, no user config."""
    runner = CliRunner(env={"COLUMNS": "80", "HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def invoke(*args: str, uri: str | None = redis_url) -> Result:
        prefix = ["-u", uri] if uri is not None else []
        return runner.invoke(main, [*prefix, *args], catch_exceptions=False)

    return invoke


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def assert_fits_80(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide


@pytest.fixture
def state(redis_url: str, r: sync_redis.Redis) -> dict[str, Any]:
    """A realistic Go-written Redis: two queues with tasks in every state."""
    # Fresh for each test, not the module's import time: the CLI reads today's daily
    # counters on the real clock, and a suite that ran past midnight read none.
    now = same_day_now()
    out: dict[str, Any] = {"now": now}

    async def fill(rr: Redis) -> None:
        out["pending"] = [GoTask("email:welcome", b'{"user_id": %d}' % i) for i in range(3)]
        for i, t in enumerate(out["pending"]):
            await go.enqueue(rr, t, now - timedelta(seconds=30 - i))
        out["active"] = GoTask("image:resize", b'{"src": "cat.png"}', queue="critical")
        await go.seed_active(rr, out["active"], now + timedelta(seconds=30))
        out["scheduled"] = GoTask("report:daily", b"{}")
        await go.schedule(rr, out["scheduled"], now + timedelta(minutes=5))
        out["retry"] = GoTask(
            "webhook:send",
            b"{}",
            retried=2,
            error_msg="503 Service Unavailable",
            last_failed_at=go.unix(now),
        )
        await go.seed_retry(rr, out["retry"], now + timedelta(minutes=1))
        out["archived"] = GoTask("pdf:render", b"\x89PDF\x00\xff", error_msg="out of memory")
        await go.seed_archived(rr, out["archived"], now - timedelta(hours=2))
        out["completed"] = GoTask("email:welcome", b"{}", completed_at=go.unix(now), retention=3600)
        await go.seed_completed(rr, out["completed"], result=b'{"sent": true}')
        out["aggregating"] = [
            GoTask("notify:digest", b"%d" % i, queue="critical", group_key="user:42")
            for i in range(2)
        ]
        for t in out["aggregating"]:
            await go.add_to_group(rr, t, now)
        await go.seed_daily(rr, "default", now, 1520, 12)
        await go.seed_daily(rr, "default", now - timedelta(days=1), 2210, 40)
        await go.seed_totals(rr, "default", 48210, 402)
        out["server"] = await go.seed_server(
            rr,
            now=now,
            host="worker-1",
            pid=3120,
            concurrency=20,
            queues={"critical": 6, "default": 3},
            workers=[GoWorker(out["active"], now, now + timedelta(minutes=30))],
            ttl=600,
        )
        entry = go.encode_scheduler_entry(
            entry_id=ENTRY_ID,
            spec="@every 1h",
            task_type="report:hourly",
            payload=b"",
            options=['Queue("default")', "MaxRetry(3)"],
            next_at=now + timedelta(minutes=20),
            prev_at=None,
        )
        await go.seed_scheduler(rr, "worker-1:3121:abc", [entry], now, ttl=600)
        for i in range(3):
            await go.seed_enqueue_event(rr, ENTRY_ID, f"task-{i}", now - timedelta(hours=3 - i))

    seed(redis_url, fill)
    return out


def hstate(r: sync_redis.Redis, t: GoTask) -> str | None:
    v = r.hget(t.key, "state")
    return None if v is None else v.decode()


# -- help, version, config --------------------------------------------------------------------

COMMAND_PATHS = [
    [],
    ["stats"],
    ["queue"],
    ["queue", "ls"],
    ["queue", "inspect"],
    ["queue", "history"],
    ["queue", "pause"],
    ["queue", "resume"],
    ["queue", "rm"],
    ["task"],
    ["task", "ls"],
    ["task", "inspect"],
    ["task", "cancel"],
    ["task", "archive"],
    ["task", "delete"],
    ["task", "run"],
    ["task", "enqueue"],
    ["task", "archiveall"],
    ["task", "deleteall"],
    ["task", "runall"],
    ["group", "ls"],
    ["server", "ls"],
    ["cron", "ls"],
    ["cron", "history"],
    ["worker"],
    ["dash"],
]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(p) or "asyncq")
def test_help(cli: Callable[..., Result], path: list[str]) -> None:
    result = cli(*path, "--help", uri=None)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: asyncq")
    assert_fits_80(result.stdout)


def test_no_arguments_prints_help(cli: Callable[..., Result]) -> None:
    result = cli(uri=None)
    assert result.exit_code == 0 and "Commands:" in result.stdout


def test_version(cli: Callable[..., Result]) -> None:
    result = cli("--version", uri=None)
    assert result.exit_code == 0 and result.stdout.startswith("asyncq, version ")


def test_uri_from_env_and_config(
    redis_url: str, r: sync_redis.Redis, state: dict[str, Any], tmp_path: Path
) -> None:
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": redis_url})
    result = runner.invoke(main, ["queue", "ls"])
    assert result.exit_code == 0 and result.stdout.split() == ["critical", "default"]

    # ~/.asyncq.toml is read when present; the environment wins over it.
    (tmp_path / ".asyncq.toml").write_text(f'uri = "{redis_url}"\n')
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})
    assert runner.invoke(main, ["queue", "ls"]).stdout.split() == ["critical", "default"]
    dead = f"redis://127.0.0.1:{free_port()}/0"
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": dead})
    assert_one_line_error(runner.invoke(main, ["queue", "ls"]), "cannot connect", dead)

    other = tmp_path / "other.toml"
    other.write_text(f'uri = "{redis_url}"\n')
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})
    assert runner.invoke(main, ["--config", str(other), "queue", "ls"]).exit_code == 0
    missing = runner.invoke(main, ["--config", str(tmp_path / "nope.toml"), "queue", "ls"])
    assert_one_line_error(missing, "config file not found")
    other.write_text("uri = [")
    assert_one_line_error(
        runner.invoke(main, ["--config", str(other), "queue", "ls"]), "cannot read config file"
    )
    other.write_text('url = "redis://x"\n')
    assert_one_line_error(
        runner.invoke(main, ["--config", str(other), "queue", "ls"]), "unknown key(s) url"
    )


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["queue", "inspect", "nope"], ["queue not found: 'nope'"]),
        (["queue", "history", "nope"], ["queue not found"]),
        (["queue", "pause", "nope"], ["queue not found"]),
        (["task", "ls", "-q", "nope", "-s", "pending"], ["queue not found"]),
        (["task", "inspect", "-q", "default", "-i", "missing"], ["task not found", "missing"]),
        (["task", "archive", "-q", "default", "-i", "missing"], ["task not found"]),
        (["task", "delete", "-q", "default", "-i", "missing"], ["task not found"]),
        (["task", "run", "-q", "default", "-i", "missing"], ["task not found"]),
        (["task", "ls", "-q", "default", "-s", "bogus"], ["Invalid value for '--state'"]),
        (["task", "ls", "-q", "default"], ["Missing option '--state'"]),
        (["task", "ls", "-q", "default", "-s", "aggregating"], ["--group is required"]),
        (["task", "ls", "-q", "default", "-s", "pending", "--page", "0"], ["--page"]),
        (["queue", "history", "default", "--days", "0"], ["--days"]),
        (["task", "runall", "-q", "default", "-s", "pending"], ["Invalid value for '--state'"]),
        (["task", "enqueue", "-t", "x", "--timeout", "5x"], ["invalid duration '5x'"]),
        (["task", "enqueue", "-t", "x", "--timeout", "30"], ["missing unit"]),
        (["task", "enqueue", "-t", "x", "--deadline", "2030-01-01T00:00:00"], ["UTC offset"]),
        (["task", "enqueue", "-t", "x", "--process-at", "tomorrow"], ["RFC 3339"]),
        (
            ["task", "enqueue", "-t", "x", "--unique", "500ms"],
            ["Unique TTL cannot be less than 1s"],
        ),
        (["task", "enqueue", "-t", "x", "--header", "novalue"], ["KEY=VALUE"]),
        (["nosuchcommand"], ["No such command 'nosuchcommand'"]),
    ],
)
def test_bad_input_is_one_error_line(
    cli: Callable[..., Result], state: dict[str, Any], args: list[str], needles: list[str]
) -> None:
    result = cli(*args)
    assert_one_line_error(result, *needles)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "uri", ["foo://localhost", "redis://localhost:notaport", "redis://localhost/abc", "nonsense"]
)
def test_malformed_uri(cli: Callable[..., Result], uri: str) -> None:
    assert_one_line_error(cli("stats", uri=uri), "invalid Redis URI")


@pytest.mark.parametrize(
    "args",
    [
        ["stats"],
        ["queue", "ls"],
        ["task", "ls", "-q", "default", "-s", "pending"],
        ["server", "ls"],
        ["task", "enqueue", "-t", "x"],
        ["dash"],
    ],
)
def test_redis_unreachable(cli: Callable[..., Result], args: list[str]) -> None:
    uri = f"redis://127.0.0.1:{free_port()}/0"
    assert_one_line_error(cli(*args, uri=uri), "cannot connect to Redis at", uri)


def test_password_is_not_printed(cli: Callable[..., Result]) -> None:
    uri = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    result = cli("queue", "ls", uri=uri)
    assert_one_line_error(result, "cannot connect", ":***@")
    assert "s3cret" not in result.output


# -- read commands ----------------------------------------------------------------------------


def test_stats(cli: Callable[..., Result], state: dict[str, Any]) -> None:
    result = cli("stats")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for heading in ("Task Count by State", "Task Count by Queue", "Daily Stats", "Redis Info"):
        assert heading in out
    lines = out.splitlines()
    pending_line = next(line for line in lines if line.startswith("pending "))
    assert pending_line.endswith(" 3") and ("█" in pending_line or "#" in pending_line)
    assert "1520" in out and "0.79%" in out
    assert_fits_80(out)

    data = json.loads(cli("stats", "--json").stdout)
    assert data["by_state"] == {
        "active": 1, "pending": 3, "aggregating": 2, "scheduled": 1, "retry": 1,
        "archived": 1, "completed": 1,
    }  # fmt: skip
    assert data["by_queue"] == {"critical": 3, "default": 7}
    assert data["daily"]["processed"] == 1520 and data["redis"]["version"]


def test_queue_ls_inspect_history(cli: Callable[..., Result], state: dict[str, Any]) -> None:
    assert cli("queue", "ls").stdout.split() == ["critical", "default"]
    assert json.loads(cli("queue", "ls", "--json").stdout) == ["critical", "default"]

    result = cli("queue", "inspect", "default", "critical")
    assert result.exit_code == 0
    assert "Queue: default" in result.stdout and "Queue: critical" in result.stdout
    assert "processed 1520, failed 12" in result.stdout
    assert "All time: processed 48210, failed 402" in result.stdout
    assert_fits_80(result.stdout)
    infos = json.loads(cli("queue", "inspect", "default", "--json").stdout)
    assert infos[0]["pending"] == 3 and infos[0]["latency"] > 25 and not infos[0]["paused"]

    # One unknown queue among good ones: the good ones print, the bad one is an error line.
    mixed = cli("queue", "inspect", "default", "nope")
    assert_one_line_error(mixed, "queue not found: 'nope'")
    assert "Queue: default" in mixed.stdout

    hist = cli("queue", "history", "default", "--days", "2")
    assert hist.exit_code == 0
    assert f"{state['now'].date().isoformat()}  1520       12      0.79%" in hist.stdout
    data = json.loads(cli("queue", "history", "default", "-x", "3", "--json").stdout)
    assert [d["processed"] for d in data["default"]] == [1520, 2210, 0]


def test_queue_ls_cluster_on_plain_redis(cli: Callable[..., Result], state: dict[str, Any]) -> None:
    assert_one_line_error(cli("queue", "ls", "--cluster"), "not running in cluster mode")


@pytest.mark.parametrize(
    ("queue", "st", "key", "columns"),
    [
        ("default", "pending", "pending", ["ID", "Type", "Payload"]),
        ("critical", "active", "active", ["Orphaned"]),
        ("default", "scheduled", "scheduled", ["Process In"]),
        ("default", "retry", "retry", ["Retry In", "Retried", "Error"]),
        ("default", "archived", "archived", ["Failed", "Error"]),
        ("default", "completed", "completed", ["Completed", "Result"]),
    ],
)
def test_task_ls(
    cli: Callable[..., Result],
    state: dict[str, Any],
    queue: str,
    st: str,
    key: str,
    columns: list[str],
) -> None:
    result = cli("task", "ls", "-q", queue, "-s", st)
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0]
    assert all(c in header for c in columns)
    expected = state[key] if isinstance(state[key], list) else [state[key]]
    for t in expected:
        assert t.id in result.stdout  # IDs are never shortened
    assert_fits_80(result.stdout)
    data = json.loads(cli("task", "ls", "-q", queue, "-s", st, "--json").stdout)
    assert [d["id"] for d in data] == [t.id for t in expected]
    assert all(d["state"] == st for d in data)


def test_task_ls_details(cli: Callable[..., Result], state: dict[str, Any]) -> None:
    archived = cli("task", "ls", "-q", "default", "-s", "archived").stdout
    assert "non-printable bytes (6)" in archived or "non-print…" in archived
    data = json.loads(cli("task", "ls", "-q", "default", "-s", "archived", "--json").stdout)
    assert data[0]["payload"] is None and data[0]["payload_base64"] == "iVBERgD/"
    page = cli("task", "ls", "-q", "default", "-s", "pending", "--size", "2", "--page", "2")
    assert state["pending"][2].id in page.stdout and state["pending"][0].id not in page.stdout
    empty = cli("task", "ls", "-q", "default", "-s", "active")
    assert empty.exit_code == 0 and empty.stdout.strip() == "No active tasks"
    agg = cli("task", "ls", "-q", "critical", "-s", "aggregating", "-g", "user:42", "--json")
    assert {d["id"] for d in json.loads(agg.stdout)} == {t.id for t in state["aggregating"]}
    completed = json.loads(cli("task", "ls", "-q", "default", "-s", "completed", "--json").stdout)
    assert completed[0]["result"] == '{"sent": true}'


def test_task_inspect(cli: Callable[..., Result], state: dict[str, Any]) -> None:
    t = state["retry"]
    result = cli("task", "inspect", "-q", "default", "-i", t.id)
    assert result.exit_code == 0
    out = result.stdout
    assert f"ID:           {t.id}" in out and "State:        retry" in out
    assert "Retried:      2/25" in out and "Last error:   503 Service Unavailable" in out
    data = json.loads(cli("task", "inspect", "-q", "default", "-i", t.id, "--json").stdout)
    assert data["retried"] == 2 and data["timeout"] == 1800.0
    arch = cli("task", "inspect", "-q", "default", "-i", state["archived"].id).stdout
    assert "Payload:      non-printable bytes (6)" in arch


def test_group_server_cron(cli: Callable[..., Result], state: dict[str, Any]) -> None:
    groups = cli("group", "ls", "-q", "critical")
    assert groups.exit_code == 0 and "user:42  2" in groups.stdout
    assert json.loads(cli("group", "ls", "-q", "critical", "--json").stdout) == [
        {"group": "user:42", "size": 2}
    ]
    assert cli("group", "ls", "-q", "default").stdout.strip() == "No groups"

    servers = cli("server", "ls")
    assert servers.exit_code == 0
    row = servers.stdout.splitlines()[2].split()
    assert row[:5] == ["worker-1", "3120", "active", "1/20", "critical:6"]
    data = json.loads(cli("server", "ls", "--json").stdout)
    assert data[0]["id"] == state["server"]
    assert data[0]["active_workers"][0]["task_id"] == state["active"].id

    cron = cli("cron", "ls")
    assert cron.exit_code == 0
    assert ENTRY_ID in cron.stdout and "@every 1h" in cron.stdout
    assert 'Queue("default"), MaxRetry(3)' in cron.stdout and "never" in cron.stdout
    assert_fits_80(cron.stdout)
    entries = json.loads(cli("cron", "ls", "--json").stdout)
    assert entries[0]["options"] == ['Queue("default")', "MaxRetry(3)"]
    assert entries[0]["prev"] is None

    hist = cli("cron", "history", ENTRY_ID, "--size", "2")
    assert hist.exit_code == 0
    assert hist.stdout.index("task-2") < hist.stdout.index("task-1")
    assert "task-0" not in hist.stdout
    events = json.loads(cli("cron", "history", ENTRY_ID, "--json").stdout)[ENTRY_ID]
    assert [e["task_id"] for e in events] == ["task-2", "task-1", "task-0"]


def test_empty_redis(cli: Callable[..., Result], r: sync_redis.Redis) -> None:
    assert cli("queue", "ls").stdout == ""
    assert cli("server", "ls").stdout.strip() == "No running servers"
    assert cli("cron", "ls").stdout.strip() == "No scheduler entries"
    stats = cli("stats")
    assert stats.exit_code == 0 and "No queues" in stats.stdout


# -- write commands ---------------------------------------------------------------------------


def test_queue_pause_resume_rm(
    cli: Callable[..., Result], r: sync_redis.Redis, state: dict[str, Any]
) -> None:
    result = cli("queue", "pause", "default", "critical")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ['Paused queue "default"', 'Paused queue "critical"']
    assert r.exists("asynq:{default}:paused") and r.exists("asynq:{critical}:paused")
    assert_one_line_error(cli("queue", "pause", "default"), 'queue "default" is already paused')
    assert cli("queue", "resume", "default").exit_code == 0
    assert not r.exists("asynq:{default}:paused")
    assert_one_line_error(cli("queue", "resume", "default"), 'queue "default" is not paused')

    assert_one_line_error(cli("queue", "rm", "default"), "queue is not empty")
    assert_one_line_error(
        cli("queue", "rm", "critical", "--force"), "cannot remove queue with active tasks"
    )
    result = cli("queue", "rm", "default", "--force")
    assert result.exit_code == 0 and result.stdout.strip() == 'Removed queue "default"'
    assert cli("queue", "ls").stdout.split() == ["critical"]
    assert not r.exists(state["pending"][0].key)


def test_task_actions(
    cli: Callable[..., Result], r: sync_redis.Redis, state: dict[str, Any]
) -> None:
    p = state["pending"][0]
    result = cli("task", "archive", "-q", "default", "-i", p.id)
    assert result.exit_code == 0 and result.stdout.strip() == f"Task {p.id} archived"
    assert hstate(r, p) == "archived"
    assert_one_line_error(
        cli("task", "archive", "-q", "default", "-i", p.id), "task is already archived"
    )
    assert cli("task", "run", "-q", "default", "-i", p.id).exit_code == 0
    assert hstate(r, p) == "pending"
    assert_one_line_error(
        cli("task", "run", "-q", "default", "-i", p.id), "task is already in pending state"
    )
    a = state["active"]
    assert_one_line_error(
        cli("task", "delete", "-q", "critical", "-i", a.id),
        "cannot delete task in active state. use CancelProcessing instead.",
    )
    assert_one_line_error(
        cli("task", "run", "-q", "critical", "-i", a.id), "task is already running"
    )
    assert cli("task", "delete", "-q", "default", "-i", p.id).exit_code == 0
    assert not r.exists(p.key)


def test_task_bulk_actions(
    cli: Callable[..., Result], r: sync_redis.Redis, state: dict[str, Any]
) -> None:
    result = cli("task", "archiveall", "-q", "default", "-s", "pending")
    assert result.stdout.strip() == "3 pending tasks archived"
    assert r.zcard("asynq:{default}:archived") == 4
    result = cli("task", "runall", "-q", "default", "-s", "archived")
    assert result.stdout.strip() == "4 archived tasks moved to pending"
    assert r.llen("asynq:{default}:pending") == 4
    result = cli("task", "deleteall", "-q", "default", "-s", "pending")
    assert result.stdout.strip() == "4 pending tasks deleted"
    assert r.llen("asynq:{default}:pending") == 0
    result = cli("task", "runall", "-q", "critical", "-s", "aggregating", "-g", "user:42")
    assert result.stdout.strip() == "2 aggregating tasks moved to pending"
    assert_one_line_error(
        cli("task", "deleteall", "-q", "critical", "-s", "aggregating"), "--group is required"
    )
    assert_one_line_error(
        cli("task", "deleteall", "-q", "default", "-s", "retry", "-g", "x"),
        "--group only applies",
    )
    result = cli("task", "deleteall", "-q", "default", "-s", "retry")
    assert result.stdout.strip() == "1 retry task deleted"


def test_task_cancel_publishes(
    cli: Callable[..., Result], r: sync_redis.Redis, state: dict[str, Any]
) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe("asynq:cancel")
    assert pubsub.get_message(timeout=2) is not None  # subscription confirmed
    result = cli("task", "cancel", "id-1", "id-2")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "Sent cancelation signal for task id-1",
        "Sent cancelation signal for task id-2",
    ]
    got = [pubsub.get_message(ignore_subscribe_messages=True, timeout=2) for _ in range(2)]
    assert [m["data"] for m in got if m] == [b"id-1", b"id-2"]
    pubsub.close()


def test_task_enqueue(cli: Callable[..., Result], r: sync_redis.Redis) -> None:
    result = cli("task", "enqueue", "-t", "email:welcome", "-l", '{"user_id": 1}')
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Enqueued task ") and '"default" (pending)' in result.stdout
    assert r.llen("asynq:{default}:pending") == 1

    result = cli(
        "task", "enqueue", "--type", "report", "--payload", "x", "--queue", "low",
        "--max-retry", "3", "--timeout", "1h30m", "--process-in", "10m", "--retention", "2h",
        "--task-id", "my-id", "--header", "trace=abc", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert (info["id"], info["queue"], info["state"], info["max_retry"]) == (
        "my-id",
        "low",
        "scheduled",
        3,
    )
    assert info["timeout"] == 5400.0 and info["retention"] == 7200.0
    assert info["headers"] == {"trace": "abc"}
    score = r.zscore("asynq:{low}:scheduled", "my-id")
    assert score is not None and abs(score - (datetime.now(UTC).timestamp() + 600)) < 30
    assert_one_line_error(
        cli("task", "enqueue", "-t", "report", "-q", "low", "--task-id", "my-id"),
        "task ID conflicts with another task",
    )
    deadline = cli(
        "task", "enqueue", "-t", "x", "--deadline", "2099-01-01T00:00:00+02:00", "--json"
    )
    assert json.loads(deadline.stdout)["deadline"] == "2098-12-31T22:00:00+00:00"


# -- the real process -------------------------------------------------------------------------


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", **(env or {})}
    full_env.pop("ASYNCQ_REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "asyncq.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


@pytest.mark.subprocess
def test_subprocess_entry_point(redis_url: str, state: dict[str, Any]) -> None:
    ok = run_module("-u", redis_url, "queue", "inspect", "default", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["queue"] == "default"

    failing = [
        ("-u", redis_url, "queue", "inspect", "nope"),
        ("-u", f"redis://127.0.0.1:{free_port()}/0", "stats"),
        ("-u", "redis://h/notadb", "stats"),
        ("-u", redis_url, "task", "inspect", "-q", "default", "-i", "x"),
    ]
    # Independent processes, mostly interpreter start-up: run side by side.
    with ThreadPoolExecutor(len(failing)) as pool:
        bad_queue, unreachable, bad_uri, bad_task = pool.map(lambda a: run_module(*a), failing)
    for proc, needle in [
        (bad_queue, "queue not found"),
        (unreachable, "cannot connect to Redis"),
        (bad_uri, "invalid Redis URI"),
        (bad_task, "task not found"),
    ]:
        assert proc.returncode == 1, proc
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_interrupt_and_unexpected_errors_are_one_line(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncq.cli._commands as commands

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "with_inspector", interrupted)
    result = cli("queue", "ls")
    assert result.exit_code == 130 and result.stderr.strip() == "error: interrupted"

    def broken(*args: Any) -> Any:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(commands, "with_inspector", broken)
    result = cli("queue", "ls")
    assert_one_line_error(result, "unexpected RuntimeError: boom second line", "ASYNCQ_DEBUG")


# -- parsing and layout helpers ---------------------------------------------------------------


@given(
    h=st.integers(0, 1000),
    m=st.integers(0, 59),
    s=st.integers(0, 59),
    ms=st.integers(0, 999),
)
def test_parse_go_durations(h: int, m: int, s: int, ms: int) -> None:
    text = "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s"), (ms, "ms")) if v) or "0"
    expected = timedelta(hours=h, minutes=m, seconds=s, milliseconds=ms)
    assert abs(parse_cli_duration(text) - expected) < timedelta(microseconds=1)


def test_parse_duration_and_time_errors() -> None:
    assert parse_cli_duration("1.5s") == timedelta(seconds=1.5)
    assert parse_cli_duration("2h45m") == timedelta(hours=2, minutes=45)
    for bad, msg in [("-5s", "negative"), ("5", "missing unit"), ("5d", "units"), ("", "e.g.")]:
        with pytest.raises(ValueError, match=msg):
            parse_cli_duration(bad)
    assert parse_time("2026-05-01T12:00:00Z") == datetime(2026, 5, 1, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match="UTC offset"):
        parse_time("2026-05-01T12:00:00")
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time("May 1st")


@given(
    rows=st.lists(
        st.lists(st.text(alphabet="abcdefgh ", max_size=60), min_size=4, max_size=4),
        max_size=5,
    ),
    width=st.integers(60, 120),
)
def test_tables_fit_their_width(rows: list[list[str]], width: int) -> None:
    ids = [["x" * 36, *r[1:]] for r in rows]
    out = table(["ID", "Type", "Payload", "Error"], ids, width=width, keep=[0])
    for line in out.splitlines():
        assert len(line) <= width
    for r in ids:
        assert r[0] in out  # kept columns are never shortened


def test_payload_formatting() -> None:
    assert format_payload(b'{"a": 1}') == '{"a": 1}'
    assert format_payload(b"line1\nline2") == "line1 line2"
    assert format_payload(b"\xff\x00") == "non-printable bytes (2)"
    assert format_payload(b"\x00ab") == "non-printable bytes (3)"
