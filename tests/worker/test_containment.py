"""Failure containment: poison handlers, event-loop stalls and what reaches the logs."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
import structlog
from redis.asyncio import Redis

from asyncq import Client, Intervals, ServeMux, Server, Task, parse_redis_uri
from asyncq import _keys as keys
from asyncq._redis.options import redact_uri
from tests.support.procs import (
    spawn,
    stop_process,
    stored_message,
    wait_for_line,
    wait_until,
)

Q = "default"
KINDS = [b"exit", b"interrupt", b"generator", b"custom"]


async def test_poison_pills_are_retried_then_archived_and_the_worker_goes_on(
    redis_url: str, redis: Redis, client: Client
) -> None:
    proc = spawn("poison_worker.py", redis_url)
    try:
        await wait_for_line(proc, "send signal TERM or INT")
        poisons = [
            await client.enqueue(Task(kind, payload), max_retry=1)
            for kind in ("poison", "poison_sync")
            for payload in KINDS
        ]
        after = await client.enqueue(Task("ok"))

        async def all_archived() -> bool:
            archived = {m.decode() for m in await redis.zrange(keys.archived_key(Q), 0, -1)}
            return all(p.id in archived for p in poisons)

        await wait_until(all_archived, within=30, what="every poison task archived")
        await wait_until(
            lambda: redis.lrange("asyncq-test:ok", 0, -1), within=10, what="ok task ran"
        )
        assert [m.decode() for m in await redis.lrange("asyncq-test:ok", 0, -1)] == [after.id]
        for p in poisons:
            stored = await redis.hgetall(keys.task_key(Q, p.id))
            assert stored[b"state"] == b"archived"
            msg = await stored_message(redis, Q, p.id)
            assert msg.retried == 1, msg  # retried once, then archived
            assert msg.error_msg.startswith(
                ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "Poison")
            )
        assert not await redis.lrange(keys.active_key(Q), 0, -1)
        assert not await redis.zrange(keys.lease_key(Q), 0, -1)

        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 20)
        out = proc.stdout.read() if proc.stdout else ""
        err = proc.stderr.read() if proc.stderr else ""
        assert rc == 0, err[-3000:]
        assert "worker exited cleanly" in out, err[-3000:]
    finally:
        stop_process(proc)


async def test_unconfigured_structlog_prints_no_locals_and_no_payloads(
    redis: Redis, redis_url: str
) -> None:
    # redis: a flushed database, so no earlier test's task reaches this worker
    proc = spawn("leaky_worker.py", redis_url)
    try:  # the worker itself gives up after 120 s of waiting for the outcomes
        out, err = await asyncio.to_thread(proc.communicate, timeout=180)
    finally:
        stop_process(proc)
    text = out + err
    assert proc.returncode == 0, text[-3000:]
    assert "all outcomes written" in out
    assert "5ec7e7" not in text  # the local variable holding the API key
    assert "4111-1111" not in text  # the payload bytes
    assert "locals" not in text
    # The unexpected error keeps a plain traceback; SkipRetry and the missing handler
    # are one line each.
    assert text.count("Traceback (most recent call last)") == 1, text
    assert "ValueError: upstream refused the request" in text
    failed = [line for line in text.splitlines() if "task failed" in line]
    assert len(failed) == 3, "\n".join(failed)
    assert any("SkipRetry" in line or "not retrying" in line for line in failed)
    assert any("handler not found" in line.lower() for line in failed), failed


REDACTED = [
    ("redis://:s3cret@localhost:6379/0", "redis://:***@localhost:6379/0"),
    ("redis://user:s3cret@localhost:6379", "redis://user:***@localhost:6379"),
    ("rediss://user:se/cr?e#t@cache.example:6380/1", "rediss://user:***@cache.example:6380/1"),
    ("redis://:p@ss@localhost", "redis://:***@localhost"),
    ("redis-socket://:s3cret@/run/redis.sock?db=1", "redis-socket://:***@/run/redis.sock?db=1"),
    (
        "redis-sentinel://:sentpw@h1:26379,h2:26379?master=mymaster&password=masterpw",
        "redis-sentinel://:***@h1:26379,h2:26379?master=mymaster&password=***",
    ),
    (
        "redis-sentinel://h1:26379?password=a#b/c?d&master=m",
        "redis-sentinel://h1:26379?password=***&master=m",
    ),
    ("redis-cluster://u:p%2Fw@h1:7000,h2:7001", "redis-cluster://u:***@h1:7000,h2:7001"),
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("redis://user@localhost", "redis://user@localhost"),
]


@pytest.mark.parametrize(("uri", "shown"), REDACTED)
def test_uri_passwords_are_redacted(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


@pytest.mark.parametrize(
    "uri",
    [
        "redis://:se/cr?e#t@localhost:99999/0",
        "redis-sentinel://h1:26379?password=s3cret#x&bogus=1",
        "redis://:s3cret@localhost:6379/0?bogus=1",
    ],
)
def test_uri_errors_never_show_the_password(uri: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_redis_uri(uri)
    assert "s3cret" not in str(info.value)
    assert "cr?e#t" not in str(info.value)


@pytest.mark.parametrize("target", ["uri", "ready client"])
async def test_a_handler_blocking_the_loop_does_not_get_colocated_tasks_rerun(
    redis_url: str, redis: Redis, client: Client, target: str
) -> None:
    """Lease 3 s, a handler blocking the loop for 5 s, a second worker recovering at once."""
    runs: dict[str, int] = {}
    events: list[dict[str, Any]] = []

    async def colocated(task: Task) -> None:
        runs[task.id or ""] = runs.get(task.id or "", 0) + 1
        await asyncio.sleep(2.0)

    async def stall(task: Task) -> None:
        runs[task.id or ""] = runs.get(task.id or "", 0) + 1
        time.sleep(5.0)  # noqa: ASYNC251 - blocks the event loop: what the watchdog is for

    def capture(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        events.append(dict(event, level=method))
        raise structlog.DropEvent

    mux = ServeMux()
    mux.handle("colocated", colocated)
    mux.handle("stall", stall)
    server = Server(
        redis_url if target == "uri" else redis,
        concurrency=3,
        lease_duration=timedelta(seconds=3),
        intervals=Intervals(heartbeat=timedelta(seconds=1), task_check=timedelta(milliseconds=100)),
        logger=structlog.wrap_logger(structlog.PrintLogger(), processors=[capture]),
    )
    infos = [await client.enqueue(Task("colocated")) for _ in range(2)]
    await server.start(mux)
    second = None
    try:
        await wait_until(lambda: len(runs) == 2, what="co-located tasks running")
        blocker = await client.enqueue(Task("stall"))
        await wait_until(lambda: blocker.id in runs, what="blocking task started")
        # Now a second worker recovers every lease that expires, with no cutoff.
        second = spawn(
            "worker.py", redis_url, "recoverer_interval=0.2", "recoverer_cutoff=0",
            "heartbeat=0.2", "task_check=0.1", "lease=3",
        )  # fmt: skip
        await wait_for_line(second, "send signal TERM or INT")

        async def all_done() -> bool:
            return not any([await redis.exists(keys.task_key(Q, i.id)) for i in [*infos, blocker]])

        await wait_until(all_done, within=30, what="every task done")
        await asyncio.sleep(1.0)  # a wrongly recovered task would run again meanwhile
    finally:
        await server.shutdown()
        if second is not None:
            second.send_signal(signal.SIGTERM)
            await asyncio.to_thread(second.wait, 20)
            stop_process(second)
    assert runs == {i.id: 1 for i in [*infos, blocker]}
    assert not await redis.zrange(keys.retry_key(Q), 0, -1)
    assert not await redis.zrange(keys.archived_key(Q), 0, -1)
    stalls = [e for e in events if e["event"] == "event loop blocked"]
    assert stalls, [e["event"] for e in events]
    assert stalls[0]["level"] == "warning"
    assert stalls[0]["task_id"] == blocker.id
    assert stalls[0]["task_type"] == "stall"
    assert stalls[0]["blocked_for"] >= 4.0
    assert server.stats.loop_stalls >= 1
    assert server.stats.loop_stalled_seconds >= 4.0
    print(f"stall measured: blocked_for={stalls[0]['blocked_for']}s")


def test_cli_edge_cases_are_one_clear_line(redis_url: str, tmp_path: Any) -> None:
    import redis as sync_redis
    from click.testing import CliRunner

    from asyncq.cli import main

    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def one_line(args: list[str], *needles: str) -> None:
        result = runner.invoke(main, args, catch_exceptions=False)
        assert result.exit_code != 0, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "Traceback" not in result.output and "OverflowError" not in result.output
        for needle in needles:
            assert needle in lines[0], lines[0]

    one_line(["-u", "", "queue", "ls"], "empty")
    one_line(["-u", redis_url, "task", "enqueue", "-t", "t", "--timeout", "99999999999999h"],
             "too large")  # fmt: skip
    one_line(
        ["-u", redis_url, "task", "enqueue", "-t", "t", "--process-in", "9" * 25 + "s"], "too large"
    )
    one_line(["-u", redis_url, "queue", "history", "default", "--days", "99999999999"], "--days")
    one_line(["-u", redis_url, "task", "ls", "-q", "default", "-s", "pending", "--size",
              "9999999999999999999"], "--size")  # fmt: skip
    one_line(["-u", redis_url, "task", "ls", "-q", "default", "-s", "pending", "--page",
              "9999999999999999999"], "--page")  # fmt: skip

    # An archived undecodable task shows the reason stored when it was archived.
    r = sync_redis.Redis.from_url(redis_url)
    try:
        reason = "asyncq: cannot decode task message (ValueError: truncated)"
        r.hset(keys.task_key(Q, "broken"), mapping={
            "msg": b"\xff\x00garbage", "state": "archived", "asyncq_error": reason,
        })  # fmt: skip
        r.zadd(keys.archived_key(Q), {"broken": 1_700_000_000})
        r.sadd(keys.ALL_QUEUES, Q)
        result = runner.invoke(
            main, ["-u", redis_url, "task", "inspect", "-q", Q, "-i", "broken"],
            catch_exceptions=False,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert reason in result.output
        assert "NoneType" not in result.output
    finally:
        r.close()
