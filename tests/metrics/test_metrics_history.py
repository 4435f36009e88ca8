"""Metrics history in Redis: what a run of known handlers wrote, its expiry, the writes
per flush, a failed flush, the Inspector's reading and ``asyncq metrics top``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from redis.asyncio import Redis

from asyncq import (
    Client,
    Inspector,
    Limits,
    RateLimited,
    RevokeTask,
    ServeMux,
    Server,
    SkipRetry,
    Task,
)
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq.cli import main
from asyncq.cli.metrics import seconds_text
from asyncq.history import BUCKETS, HistoryRecorder, bucket_of, percentile, upper_bound
from asyncq.hooks import NO_HOOKS, CombinedHooks, NoWorkerHooks, combine_hooks
from asyncq.metrics import WorkerMetrics
from asyncq.mux import Handler
from tests.support.helpers import expiretime, wait_until

QUEUES = ("hist-a", "hist-b")
TIMED_MS = [4] * 20 + [30] * 15 + [120] * 5


def true_percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-int(q * len(ordered) * 1000) // 1000) - 1)]


@contextlib.asynccontextmanager
async def monitored(redis_url: str) -> AsyncIterator[list[list[str]]]:
    """The commands Redis runs meanwhile (MONITOR), scripts' inner commands included."""
    seen: list[list[str]] = []
    client = Redis.from_url(redis_url)
    started = asyncio.Event()

    async def listen() -> None:
        async with client.monitor() as m:
            started.set()
            async for info in m.listen():
                seen.append(str(info["command"]).split())

    task = asyncio.create_task(listen())
    await asyncio.wait_for(started.wait(), 5)  # set once Redis answered MONITOR with OK
    try:
        yield seen
    finally:
        # MONITOR reports commands in the order Redis ran them: once this marker is
        # seen, so is every command before it.
        marker = f"monitored-end-{uuid.uuid4()}"
        await client.echo(marker)
        await wait_until(lambda: any(marker in c for c in seen), what="the end marker")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await client.aclose()


def metrics_calls(seen: list[list[str]]) -> list[list[str]]:
    """The EVALSHA calls that wrote a metrics history hash."""
    return [c for c in seen if c and c[0].upper() == "EVALSHA" and any(":metrics:" in a for a in c)]


async def test_history_is_what_known_handlers_did(
    serve: Callable[..., Awaitable[Server]], redis: Redis, redis_url: str
) -> None:
    measured: list[float] = []
    runs: dict[str, int] = {}
    mux = ServeMux()

    @mux.handler("fast")
    async def fast(task: Task) -> None:
        runs["fast"] = runs.get("fast", 0) + 1

    @mux.handler("timed")
    async def timed(task: Task) -> None:
        start = time.perf_counter()
        await asyncio.sleep(int(task.payload) / 1000)
        measured.append(time.perf_counter() - start)
        runs["timed"] = runs.get("timed", 0) + 1

    @mux.handler("flaky")
    async def flaky(task: Task) -> None:
        runs["flaky"] = runs.get("flaky", 0) + 1
        raise RuntimeError("always")

    @mux.handler("fatal")
    async def fatal(task: Task) -> None:
        runs["fatal"] = runs.get("fatal", 0) + 1
        raise SkipRetry("no")

    server = await serve(
        mux,
        queues={q: 1 for q in QUEUES},
        metrics_history=timedelta(minutes=30),
        retry_delay=lambda n, exc, task: timedelta(milliseconds=10),
    )
    async with Client(redis) as client:
        for _ in range(30):
            await client.enqueue(Task("fast"), queue="hist-a")
        for ms in TIMED_MS:
            await client.enqueue(Task("timed", str(ms).encode()), queue="hist-b")
        for _ in range(4):
            await client.enqueue(Task("flaky"), queue="hist-a", max_retry=1)
        for _ in range(3):
            await client.enqueue(Task("fatal"), queue="hist-b", max_retry=5)
    async with Inspector(redis) as insp:
        async with asyncio.timeout(30):
            while True:
                infos = [await insp.queue_info(q) for q in QUEUES]
                if sum(i.archived for i in infos) == 7 and sum(i.size for i in infos) == 7:
                    break
                await asyncio.sleep(0.05)
        await server.shutdown()  # the last flush
        assert runs == {"fast": 30, "timed": 40, "flaky": 8, "fatal": 3}

        got = {
            (m.queue, m.task_type): m
            for m in await insp.metrics_history(window=timedelta(minutes=10))
        }
        assert set(got) == {
            ("hist-a", "fast"),
            ("hist-a", "flaky"),
            ("hist-b", "timed"),
            ("hist-b", "fatal"),
        }
        counts = {k: (m.processed, m.failed, m.retried, m.archived) for k, m in got.items()}
        assert counts == {
            ("hist-a", "fast"): (30, 0, 0, 0),
            ("hist-a", "flaky"): (8, 8, 4, 4),
            ("hist-b", "timed"): (40, 0, 0, 0),
            ("hist-b", "fatal"): (3, 3, 0, 3),
        }
        timed_row = got[("hist-b", "timed")]
        assert sum(timed_row.buckets) == 40
        assert len(timed_row.points) == 10
        assert sum(p.processed for p in timed_row.points) == 40
        assert timed_row.run_seconds >= sum(measured)
        for q, est in ((0.5, timed_row.p50), (0.95, timed_row.p95), (0.99, timed_row.p99)):
            assert est is not None
            true = true_percentile(measured, q)
            # the handler's own clock runs inside the recorder's: at most one bucket apart
            assert abs(bucket_of(est) - bucket_of(true)) <= 1, (q, est, true)
        assert got[("hist-a", "flaky")].failure_rate == 1.0

        only = await insp.metrics_history(
            ["hist-a"], window=timedelta(minutes=5), task_types=["fast"]
        )
        assert [(m.queue, m.task_type) for m in only] == [("hist-a", "fast")]

    hashes = [k async for k in redis.scan_iter(match="asynq:{hist-*}:asyncq:metrics:*")]
    assert hashes
    for key in hashes:
        minute = int(key.rsplit(b":", 1)[1])
        expire_at = await expiretime(redis, key)
        assert expire_at == (minute + 1) * 60 + 30 * 60  # the minute's end plus the retention


def ran(
    recorder: HistoryRecorder,
    queue: str,
    task_type: str,
    seconds: float = 0.0001,
    *,
    failed: bool = False,
    retried: bool = False,
    archived: bool = False,
) -> None:
    """Report one run that ended now, as the processor does."""
    ended = time.time()
    recorder.record(queue, task_type, ended - seconds, ended, failed, retried, archived)


async def test_on_by_default_and_off_writes_nothing(
    serve: Callable[..., Awaitable[Server]], redis: Redis
) -> None:
    mux = ServeMux()
    ran: list[str] = []
    all_ran = asyncio.Event()

    @mux.handler("t")
    async def handler(task: Task) -> None:
        ran.append(task.queue or "")
        if len(ran) == 10:
            all_ran.set()

    async with Client(redis) as client:
        await client.enqueue_many([Task("t") for _ in range(5)], queue="hist-a")
        await client.enqueue_many([Task("t") for _ in range(5)], queue="hist-b")
    on = await serve(mux, queues={"hist-a": 1})  # on by default
    off = await serve(mux, queues={"hist-b": 1}, metrics_history=False)
    assert on.history is not None and off.history is None
    await asyncio.wait_for(all_ran.wait(), 30)
    await on.shutdown()  # the last flush
    await off.shutdown()
    assert sorted(ran) == ["hist-a"] * 5 + ["hist-b"] * 5
    written = [k async for k in redis.scan_iter(match="asynq:{hist-*}:asyncq:metrics:*")]
    assert written and all(k.startswith(b"asynq:{hist-a}:") for k in written)
    async with Inspector(redis) as insp:
        rows = await insp.metrics_history(window=timedelta(minutes=3))
    assert [(m.queue, m.task_type, m.processed) for m in rows] == [("hist-a", "t", 5)]


async def test_what_counts_is_the_outcome_the_processor_decided(
    serve: Callable[..., Awaitable[Server]], redis: Redis
) -> None:
    """Counted where the outcome is decided: a run stopped by its deadline is a failure
    that is retried, a revoked run and a rate-limited run raised (failed) but neither is
    retried, and a task its type's rate limit put back unrun is not counted at all."""
    mux = ServeMux()
    ran: dict[str, int] = {}

    @mux.handler("slow")
    async def slow(task: Task) -> None:
        ran["slow"] = ran.get("slow", 0) + 1
        await asyncio.sleep(30)

    @mux.handler("revoked")
    async def revoked(task: Task) -> None:
        ran["revoked"] = ran.get("revoked", 0) + 1
        raise RevokeTask()

    @mux.handler("later")
    async def later(task: Task) -> None:
        ran["later"] = ran.get("later", 0) + 1
        raise RateLimited(timedelta(hours=1))

    @mux.handler("scarce")
    async def scarce(task: Task) -> None:
        ran["scarce"] = ran.get("scarce", 0) + 1

    server = await serve(
        mux,
        queues={"hist-a": 1},
        metrics_history=True,
        limits=Limits(type_rate_limits={"scarce": "1/h"}),
        retry_delay=lambda n, exc, task: timedelta(hours=1),
    )
    async with Client(redis) as client:
        await client.enqueue(Task("slow"), queue="hist-a", timeout=timedelta(seconds=1))
        await client.enqueue(Task("revoked"), queue="hist-a")
        await client.enqueue(Task("later"), queue="hist-a")
        for _ in range(3):
            await client.enqueue(Task("scarce"), queue="hist-a")
    async with Inspector(redis) as insp:
        async with asyncio.timeout(30):
            while True:
                info = await insp.queue_info("hist-a")
                # slow, later and two scarce wait in the retry set; revoked is gone
                if info.retry == 4 and info.pending == info.active == 0:
                    break
                await asyncio.sleep(0.05)
        await server.shutdown()
        assert ran == {"slow": 1, "revoked": 1, "later": 1, "scarce": 1}
        got = {
            m.task_type: (m.processed, m.failed, m.retried, m.archived)
            for m in await insp.metrics_history(window=timedelta(minutes=3))
        }
    assert got == {
        "slow": (1, 1, 1, 0),
        "revoked": (1, 1, 0, 0),
        "later": (1, 1, 0, 0),
        "scarce": (1, 0, 0, 0),
    }


async def test_a_flush_writes_once_per_queue_and_minute(redis: Redis, redis_url: str) -> None:
    recorder = HistoryRecorder(Broker(redis), log=structlog.get_logger())
    for i in range(600):
        ran(recorder, QUEUES[i % 2], f"type-{i % 3}")
    async with monitored(redis_url) as seen:
        await recorder.flush()
    calls = metrics_calls(seen)
    # 600 runs, 2 queues: one script call per queue and minute (two minutes at most)
    assert 2 <= len(calls) <= 4, calls
    hincrby = [c for c in seen if c and c[0].upper() == "HINCRBY"]
    fields_per_type = 2 + 1  # processed, run time, and one bucket (every run under 1 ms)
    assert len(hincrby) <= 2 * 3 * fields_per_type, hincrby
    async with Inspector(redis) as insp:
        for q in QUEUES:
            await redis.sadd(keys.ALL_QUEUES, q)
        rows = await insp.metrics_history(window=timedelta(minutes=2))
    assert sum(m.processed for m in rows) == 600
    assert {m.processed for m in rows} == {100}


async def test_the_history_role_flushes_each_interval_and_at_shutdown(redis: Redis) -> None:
    """A supervised role of its own writes the counts; its finish writes the last ones."""
    from asyncq._worker.history_flusher import HistoryFlusher
    from asyncq._worker.roles import supervise
    from tests.support.fakebroker import FakeBroker
    from tests.support.roles import role_deps

    recorder = HistoryRecorder(
        Broker(redis), flush_interval=timedelta(milliseconds=50), log=structlog.get_logger()
    )
    role = HistoryFlusher(role_deps(FakeBroker()), recorder=recorder)  # the recorder writes
    assert role.interval == 0.05
    running = asyncio.create_task(supervise(role))

    async def processed() -> int:
        async with Inspector(redis) as insp:
            rows = await insp.metrics_history(queues=[QUEUES[0]], window=timedelta(minutes=2))
        return sum(m.processed for m in rows)

    await redis.sadd(keys.ALL_QUEUES, QUEUES[0])
    ran(recorder, QUEUES[0], "periodic")
    await wait_until(processed, what="the periodic flush")
    assert await processed() == 1
    await role.drain(0, force=asyncio.Event())
    await asyncio.wait_for(running, 5)
    ran(recorder, QUEUES[0], "periodic")  # after the role's loop ended: the last count
    await role.finish(forced=False)
    assert await processed() == 2


async def test_a_worker_run_writes_per_flush_not_per_task(
    serve: Callable[..., Awaitable[Server]], redis: Redis, redis_url: str
) -> None:
    done = asyncio.Event()
    count = 0
    total = 400
    mux = ServeMux()

    @mux.handler("t")
    async def handler(task: Task) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    async with Client(redis) as client:
        await client.enqueue_many([Task("t") for _ in range(total)], queue="hist-a")
    async with monitored(redis_url) as seen:
        started = time.monotonic()
        server = await serve(mux, queues={"hist-a": 1}, metrics_history=True)
        async with asyncio.timeout(60):
            await done.wait()
        await server.shutdown()
        elapsed = time.monotonic() - started
    calls = metrics_calls(seen)
    flushes = elapsed / 5 + 2  # the periodic flushes and the last one
    assert 1 <= len(calls) <= 2 * flushes, (len(calls), elapsed)
    async with Inspector(redis) as insp:
        (row,) = await insp.metrics_history(window=timedelta(minutes=3))
    assert row.processed == total


async def test_a_failed_flush_keeps_its_counts(redis: Redis) -> None:
    recorder = HistoryRecorder(Broker(redis), log=structlog.get_logger())
    minute = int(time.time()) // 60
    blockers = [keys.metrics_history_key("hist-a", m) for m in (minute, minute + 1)]
    for key in blockers:
        await redis.set(key, "not a hash")
    for _ in range(4):
        ran(recorder, "hist-a", "kept")
    ran(recorder, "hist-a", "kept", failed=True, retried=True)
    await recorder.flush()  # WRONGTYPE: logged, kept
    await redis.delete(*blockers)
    await recorder.flush()
    await redis.sadd(keys.ALL_QUEUES, "hist-a")
    async with Inspector(redis) as insp:
        (row,) = await insp.metrics_history(window=timedelta(minutes=3))
    assert (row.processed, row.failed, row.retried) == (5, 1, 1)


def test_buckets_and_percentiles() -> None:
    assert bucket_of(0.0) == 0 and bucket_of(0.001) == 0
    assert bucket_of(0.0011) == 1
    assert bucket_of(10**6) == BUCKETS - 1
    for k in range(1, BUCKETS - 1):
        assert bucket_of(upper_bound(k)) == k
        assert bucket_of(upper_bound(k) * 1.0001) == k + 1
    counts = [0] * BUCKETS
    assert percentile(counts, 0.5) is None
    counts[bucket_of(0.05)] = 99
    counts[bucket_of(2.0)] = 1
    p50 = percentile(counts, 0.5)
    p99 = percentile(counts, 0.99)
    p100 = percentile(counts, 1.0)
    assert p50 is not None and bucket_of(p50) == bucket_of(0.05)
    assert p99 is not None and bucket_of(p99) == bucket_of(0.05)
    assert p100 is not None and bucket_of(p100) == bucket_of(2.0)


def test_recorder_and_server_options_are_checked(redis: Redis) -> None:
    log = structlog.get_logger()
    with pytest.raises(ValueError, match="at least 1 minute"):
        HistoryRecorder(Broker(redis), retention=timedelta(seconds=5), log=log)
    with pytest.raises(TypeError, match=r"retention must be a datetime\.timedelta"):
        HistoryRecorder(Broker(redis), retention=3600, log=log)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="flush_interval"):
        HistoryRecorder(Broker(redis), flush_interval=timedelta(0), log=log)
    assert Server(redis, metrics_history=False).history is None
    with pytest.raises(TypeError, match="metrics_history must be True, False or"):
        Server(redis, metrics_history=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1 minute"):
        Server(redis, metrics_history=timedelta(0))
    server = Server(redis)  # on by default, 24 h
    assert server.history is not None and server.history.retention == timedelta(hours=24)
    server = Server(redis, metrics_history=timedelta(hours=2))
    assert server.history is not None and server.history.retention == timedelta(hours=2)


async def test_inspector_checks_the_window(redis: Redis) -> None:
    async with Inspector(redis) as insp:
        with pytest.raises(ValueError, match="whole number of minutes"):
            await insp.metrics_history(window=timedelta(seconds=90))
        with pytest.raises(ValueError, match="step must be"):
            await insp.metrics_history(window=timedelta(hours=1), step=timedelta(0))
        with pytest.raises(ValueError, match="at most 168 h"):
            await insp.metrics_history(window=timedelta(days=8))
        with pytest.raises(TypeError, match=r"window must be a datetime\.timedelta"):
            await insp.metrics_history(window=60)  # type: ignore[arg-type]
        assert await insp.metrics_history() == []


class Told(NoWorkerHooks):
    """An observer that notes what it is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, ...]] = []

    def instrument(self, handler: Handler) -> Handler:
        async def noted(task: Task) -> None:
            self.told.append(("ran", task.type))
            await handler(task)

        return noted

    def task_retried(self, queue: str, task_type: str) -> None:
        self.told.append(("retried", queue, task_type))

    def task_archived(self, queue: str, task_type: str) -> None:
        self.told.append(("archived", queue, task_type))


async def test_combined_hooks_call_each() -> None:
    prom = WorkerMetrics()
    told = Told()
    both = combine_hooks(told, None, prom)
    assert isinstance(both, CombinedHooks) and both.hooks == (told, prom)
    assert combine_hooks(None, NO_HOOKS) is NO_HOOKS
    assert combine_hooks(prom) is prom

    async def fails(task: Task) -> None:
        raise RuntimeError("x")

    task = Task("c")
    task.queue = "hist-a"
    with pytest.raises(RuntimeError):
        await both.instrument(fails)(task)
    both.task_retried("hist-a", "c")
    both.task_archived("hist-a", "c")
    both.lease_expired("hist-a", "c")
    both.loop_stalled(0.7)
    assert prom.retries.labels("c", "hist-a")._value.get() == 1
    assert prom.stalls._value.get() == 1
    assert told.told == [("ran", "c"), ("retried", "hist-a", "c"), ("archived", "hist-a", "c")]


async def test_cli_metrics_top(redis: Redis, redis_url: str, tmp_path: Any) -> None:
    recorder = HistoryRecorder(Broker(redis), log=structlog.get_logger())
    for _ in range(6):
        ran(recorder, "hist-a", "email:send", 0.02)
    for _ in range(2):
        ran(recorder, "hist-a", "report", failed=True)
    await recorder.flush()
    await redis.sadd(keys.ALL_QUEUES, "hist-a")
    runner = CliRunner(env={"COLUMNS": "100", "HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def run(*args: str) -> str:
        result = runner.invoke(main, ["-u", redis_url, "metrics", "top", *args])
        assert result.exit_code == 0, result.output
        return result.output

    out = await asyncio.to_thread(run, "--window", "15m")
    lines = out.splitlines()
    assert "last 15m: 8 runs of 2 task types, by processed" in lines[0]
    assert lines[1].split() == [
        "TYPE", "QUEUE", "PROCESSED", "FAILED", "FAIL%", "RETRIED", "ARCHIVED", "P50", "P95", "P99"
    ]  # fmt: skip
    first, second = lines[3].split(), lines[4].split()
    assert first[:7] == ["email:send", "hist-a", "6", "0", "0.0", "0", "0"]
    assert first[7].endswith("ms") and 16 <= float(first[7][:-2]) <= 60
    assert second[:5] == ["report", "hist-a", "2", "2", "100.0"]
    out = await asyncio.to_thread(run, "--sort", "failure-rate", "-n", "1")
    assert out.splitlines()[3].split()[0] == "report" and len(out.splitlines()) == 4
    # the Redis may also be named after ``metrics``, as for its exporter
    named = await asyncio.to_thread(
        runner.invoke, main, ["metrics", "--uri", redis_url, "top", "-n", "1"]
    )
    assert named.exit_code == 0 and named.output.splitlines()[3].split()[0] == "email:send"
    out = await asyncio.to_thread(run, "--json")
    assert '"task_type": "email:send"' in out and '"failure_rate": 1.0' in out
    result = await asyncio.to_thread(
        runner.invoke, main, ["-u", redis_url, "metrics", "top", "--window", "90s"]
    )
    assert result.exit_code != 0 and "whole number of minutes" in result.output
    for args, problem in (
        (["--watch", "--interval", "0s"], "--interval: must be positive"),
        (["--watch", "--json"], "--watch and --json do not go together"),
    ):
        result = await asyncio.to_thread(
            runner.invoke, main, ["-u", redis_url, "metrics", "top", *args]
        )
        assert result.exit_code == 2, result.output
        assert problem in result.output.replace("'", "")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.0008, "0.8ms"),
        (0.042, "42ms"),
        (1.25, "1.25s"),
        (59.99, "59.99s"),
        (200, "3m20s"),
    ],
)
def test_run_times_in_the_top_table(seconds: float | None, text: str) -> None:
    assert seconds_text(seconds) == text


async def test_cli_metrics_top_watch_redraws_until_ctrl_c(redis: Redis, redis_url: str) -> None:
    """``--watch`` redraws the table every --interval and ends quietly on Ctrl-C."""
    import signal
    import sys

    recorder = HistoryRecorder(Broker(redis), log=structlog.get_logger())
    ran(recorder, "hist-a", "email:send", 0.02)
    await recorder.flush()
    await redis.sadd(keys.ALL_QUEUES, "hist-a")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncq.cli", "-u", redis_url, "metrics", "top", "--watch",
        "--interval", "100ms", "--window", "15m",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TERM": "dumb", "COLUMNS": "100"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        draws = 0
        while draws < 3:  # the first draw and two redraws
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "the watch ended on its own"
            draws += b"last 15m: 1 run of 1 task type, by processed" in line
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
