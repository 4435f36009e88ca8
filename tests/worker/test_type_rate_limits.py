"""Rate limits per task type (``Server(type_rate_limits={"api:partner": "600/min"})``)."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest
from click.testing import CliRunner
from redis.asyncio import Redis

from asyncq import Client, Inspector, Limits, ServeMux, Server, Task
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.typerate import take_type_tokens
from asyncq.cli import main
from tests.support.procs import FAST, drain, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.flow_worker import RETRIED, STAMPS

READY = "send signal TERM or INT"


@pytest.mark.parametrize(
    ("rates", "error", "match"),
    [
        ({"api": "100/day"}, ValueError, r"type_rate_limits: task type 'api': bad rate '100/day'"),
        ({"api": "0/s"}, ValueError, "at least 1"),
        ({"a{b}": "1/s"}, ValueError, r"task type 'a\{b\}' holds"),
        ({"": "1/s"}, ValueError, "non-blank"),
        ({"api": 5}, ValueError, "a rate is a string"),
        ([("api", "1/s")], TypeError, "mapping of task type to rate"),
    ],
)
def test_bad_type_rates_are_refused_by_name(rates: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Server("redis://localhost:1", type_rate_limits=rates)  # type: ignore[arg-type]


def test_cli_refuses_a_bad_type_rate() -> None:
    res = CliRunner().invoke(
        main, ["-u", "redis://localhost:1", "worker", "x:mux", "--type-rate-limit", "api=5/week"]
    )
    assert res.exit_code == 2
    assert "--type-rate-limit" in res.output and "'api'" in res.output


async def test_bucket_gives_burst_then_reserves_short_waits_then_refuses(redis: Redis) -> None:
    broker = Broker(redis)
    iv = 1_000_000  # 1/s: the calls below take far less than an interval
    waits, next_wait = await take_type_tokens(
        broker, "t", 6, interval_us=iv, burst=3, max_wait_us=2_500_000
    )
    # Three at once, two reserved one and two intervals ahead, the sixth refused.
    assert waits == [0, 0, 0, iv, 2 * iv] and next_wait == 3 * iv
    more, next_wait = await take_type_tokens(
        broker, "t", 1, interval_us=iv, burst=3, max_wait_us=2_500_000
    )
    assert more == [] and 2 * iv < next_wait <= 3 * iv
    assert await redis.exists(keys.type_rate_key("t")) == 1
    async with Inspector(redis) as insp:
        info = await insp.type_rate("t")
        assert info is not None and (info.rate, info.tokens) == ("3/3s", 0)  # 1 token a second
        assert await insp.type_rate("other") is None
        with pytest.raises(ValueError, match="holds"):
            await insp.type_rate("a{b}")


async def test_limited_type_waits_without_using_a_retry_and_other_types_do_not(
    redis: Redis,
) -> None:
    ran: list[tuple[str, int]] = []
    mux = ServeMux()

    @mux.handler("slowtype")
    async def slow(task: Task) -> None:
        ran.append(("slowtype", task.retry_count))

    @mux.handler("free")
    async def free(task: Task) -> None:
        ran.append(("free", task.retry_count))

    server = Server(
        redis, concurrency=4, limits=Limits(type_rate_limits={"slowtype": "1/s"}), **FAST
    )
    async with Client(redis) as client:
        # max_retry=0: a rate-limited attempt counted as a failure would archive the task.
        await client.enqueue_many([Task("slowtype", b"", max_retry=0) for _ in range(6)])
        await client.enqueue_many([Task("free", b"", max_retry=0) for _ in range(3)])
    async with server:
        await server.start(mux)
        await wait_until(lambda: len(ran) == 9, within=60, what="every task")
        rescheduled = server.stats.type_rate_limited
    assert sorted(ran) == [("free", 0)] * 3 + [("slowtype", 0)] * 6
    assert rescheduled > 0  # 6 tasks at 1/s with 4 slots: some had no token within 1 s
    assert await redis.zcard(keys.archived_key("default")) == 0
    assert int(await redis.get(keys.failed_total_key("default")) or 0) == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_type_rate_bounds_starts_across_worker_processes(
    redis_url: str, redis: Redis
) -> None:
    count, period_us = 5, 1_000_000  # 5/s
    iv = period_us // count
    n = 25
    procs: list[subprocess.Popen[str]] = [
        spawn(
            "flow_worker.py",
            redis_url,
            "concurrency=4",
            "forward=0.2",
            f"typerate=tstamp:{count}/s",
        )
        for _ in range(3)
    ]
    try:
        for proc in procs:
            await wait_for_line(proc, READY)
            drain(proc)  # it logs every task: keep its pipes from filling
        sec, usec = await redis.time()
        t0 = sec * 1_000_000 + usec  # no token of the type can be taken before this
        async with Client(redis) as client:
            infos = await client.enqueue_many(
                [Task("tstamp", b"", queue="default", max_retry=0) for _ in range(n)]
            )

        async def done() -> bool:
            return await redis.llen(STAMPS) == n

        await wait_until(done, within=120, interval=0.05, what="rate-limited tasks")
        stamps = sorted(int(s) for s in await redis.lrange(STAMPS, 0, -1))
        # GCRA: by time b at most burst + (b - first token) / interval tokens were taken,
        # and each handler read TIME after its token's moment.
        for k, h in enumerate(stamps):
            assert k + 1 <= count + (h - t0) // iv, (k, h - t0)
        retried = await redis.hgetall(RETRIED)
        assert len(retried) == n and set(retried.values()) == {b"0"}
        assert {i.id for i in infos} == {k.decode() for k in retried}  # type: ignore[union-attr]
        assert await redis.zcard(keys.archived_key("default")) == 0
        assert await redis.zcard(keys.retry_key("default")) == 0
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            stop_process(proc)
