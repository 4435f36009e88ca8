"""Flow control: per-queue concurrency limits, fleet-wide and local."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Limits, RateLimited, ServeMux, Server, Task
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.multiqueue import MultiQueue
from tests.support.procs import FAST, drain, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.flow_worker import DONE, LOG, MAX, STAMPS, STARTS

READY = "send signal TERM or INT"
Q = "limited"


async def _fill(redis: Redis, n: int, queue: str = Q) -> list[str]:
    async with Client(redis) as client:
        infos = await client.enqueue_many([Task("work", b"0", queue=queue) for _ in range(n)])
    return [info.id for info in infos]  # type: ignore[union-attr]


# -- the dequeue script ------------------------------------------------------------------------


async def test_byte_budget_takes_tasks_up_to_exactly_the_budget(redis: Redis) -> None:
    ids = await _fill(redis, 6)
    size = len(await redis.hget(keys.task_key(Q, ids[0]), "msg"))  # every message is as long
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q], 10, max_bytes=2 * size, first_free=False)
    assert [t.message.id for t in got.tasks] == ids[:2]  # the budget exactly: both fit
    got = await mq.dequeue([Q], 10, max_bytes=2 * size - 1, first_free=False)
    assert [t.message.id for t in got.tasks] == ids[2:3]  # one byte short: the second waits
    got = await mq.dequeue([Q], 10, max_bytes=size - 1, first_free=False)
    assert got.tasks == []
    got = await mq.dequeue([Q], 10, max_bytes=size - 1, first_free=True)
    assert [t.message.id for t in got.tasks] == ids[3:4]  # the first may exceed it alone
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [i.encode() for i in ids[:3:-1]]


@pytest.mark.parametrize("probe", [1, 2, 3])
async def test_queues_probed_a_few_at_a_time_give_the_same_fetch(
    redis: Redis, monkeypatch: pytest.MonkeyPatch, probe: int
) -> None:
    # One EXISTS looks at `probe` queues' pending lists (1 on a cluster): however the
    # queues are cut into chunks, each is tried in order and reported empty once.
    from asyncq._broker import multiqueue

    monkeypatch.setattr(multiqueue, "_PROBE_CHUNK", probe)
    names = ["e1", "a", "e2", "e3", "b", "e4"]
    a = await _fill(redis, 2, queue="a")
    b = await _fill(redis, 2, queue="b")
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue(names, 3)
    assert [t.message.id for t in got.tasks] == [*a, b[0]]
    assert got.empty == {"e1", "a", "e2", "e3"}  # e4 is not looked at
    got = await mq.dequeue(names, 3)
    assert [t.message.id for t in got.tasks] == [b[1]]
    assert got.empty == set(names)


async def test_one_fetch_over_paused_limited_rated_and_drained_queues_reports_each(
    redis: Redis,
) -> None:
    # The worker waits on `empty` queues (paused ones too) for a wake-up and polls `held`
    # ones again later; a queue drained by its limit exactly is in neither, and a queue
    # still holding work after its limit is never reported empty.
    names = ["paused", "none", "lim", "rated", "exact", "more"]
    await _fill(redis, 1, queue="paused")
    async with Inspector(redis) as insp:
        await insp.pause("paused")
    lim = await _fill(redis, 3, queue="lim")
    rated = await _fill(redis, 2, queue="rated")
    exact = await _fill(redis, 1, queue="exact")
    more = await _fill(redis, 2, queue="more")
    limits = {"lim": (-1, 1), "rated": (-1, -1, 60_000_000, 1), "exact": (1, -1)}
    got = await MultiQueue(Broker(redis)).dequeue(names, 10, limits=limits)
    assert [t.message.id for t in got.tasks] == [lim[0], rated[0], *exact, *more]
    assert got.empty == {"paused", "none", "more"}
    assert got.held == {"lim", "rated"}
    assert await redis.llen(keys.pending_key("paused")) == 1


async def test_fleet_limit_caps_a_batched_fetch_by_live_leases(redis: Redis) -> None:
    await _fill(redis, 10)
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q], 10, limits={Q: (3, -1)})
    assert len(got.tasks) == 3
    assert got.held == {Q}
    again = await mq.dequeue([Q], 10, limits={Q: (3, -1)})
    assert again.tasks == [] and again.held == {Q} and Q not in again.empty
    assert await redis.llen(keys.pending_key(Q)) == 7


async def test_expired_leases_do_not_count(redis: Redis) -> None:
    await _fill(redis, 4)
    mq = MultiQueue(Broker(redis))
    # Two leases of a dead worker, expired a minute ago (recoverer has not run).
    past = int(time.time()) - 60
    await redis.zadd(keys.lease_key(Q), {"dead-1": past, "dead-2": past})
    got = await mq.dequeue([Q], 10, limits={Q: (2, -1)})
    assert len(got.tasks) == 2
    # A live lease of another worker does count.
    got = await mq.dequeue([Q], 10, limits={Q: (3, -1)})
    assert len(got.tasks) == 1


async def test_stored_limit_overrides_and_applies_without_config(redis: Redis) -> None:
    await _fill(redis, 10)
    await _fill(redis, 3, queue="default")
    mq = MultiQueue(Broker(redis))
    async with Inspector(redis) as insp:
        await insp.set_limit(Q, 1)
        assert await insp.limit(Q) == 1
        # No configured limit: the stored one applies; the other queue is not limited.
        got = await mq.dequeue([Q, "default"], 10)
        assert sorted(t.message.queue for t in got.tasks) == ["default"] * 3 + [Q]
        await insp.set_limit(Q, 4)  # raised at runtime above the configured 2
        got = await mq.dequeue([Q], 10, limits={Q: (2, -1)})
        assert len(got.tasks) == 3
        info = await insp.queue_info(Q)
        assert (info.concurrency_limit, info.running, info.pending, info.held_back) == (4, 4, 6, 6)
        await insp.set_limit(Q, None)
        assert await insp.limit(Q) is None
        got = await mq.dequeue([Q], 10, limits={Q: (5, -1)})
        assert len(got.tasks) == 1


async def test_local_room_bounds_the_fetch(redis: Redis) -> None:
    await _fill(redis, 10)
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q], 10, limits={Q: (-1, 2)})
    assert len(got.tasks) == 2 and got.held == {Q}
    got = await mq.dequeue([Q], 10, limits={Q: (-1, 0)})
    assert got.tasks == [] and got.held == {Q}


async def test_set_limit_refuses_bad_values(redis: Redis) -> None:
    await _fill(redis, 1)
    async with Inspector(redis) as insp:
        with pytest.raises(ValueError, match="0 or more"):
            await insp.set_limit(Q, -1)
        with pytest.raises(TypeError, match="int or None"):
            await insp.set_limit(Q, True)
        # The stored key goes with the queue.
        await insp.set_limit(Q, 2)
        await redis.delete(keys.pending_key(Q))
        await redis.delete(*await redis.keys(keys.task_key_prefix(Q) + "*"))
        await insp.delete_queue(Q)
    assert await redis.exists(keys.limit_key(Q)) == 0


def test_server_refuses_bad_limits() -> None:
    with pytest.raises(ValueError, match="queue_concurrency: queue 'q' needs an integer limit"):
        Server("redis://localhost:1", queue_concurrency={"q": -1})
    with pytest.raises(TypeError, match="local_queue_concurrency must be a mapping"):
        Server("redis://localhost:1", local_queue_concurrency=[("q", 1)])  # type: ignore[arg-type]


# -- worker processes --------------------------------------------------------------------------


def _workers(url: str, n: int, *args: str) -> list[subprocess.Popen[str]]:
    return [spawn("flow_worker.py", url, *args) for _ in range(n)]


async def _enqueue_work(redis: Redis, n: int, ms: int) -> set[str]:
    async with Client(redis) as client:
        infos = await client.enqueue_many(
            [Task("work", str(ms).encode(), queue=Q) for _ in range(n)]
        )
    return {info.id for info in infos}  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_three_workers_respect_the_fleet_limit_and_a_runtime_change(
    redis_url: str, redis: Redis
) -> None:
    procs = _workers(redis_url, 3, "concurrency=20", f"limits={Q}:2")
    try:
        for proc in procs:
            await wait_for_line(proc, READY)
            drain(proc)  # it logs every task: keep its pipes from filling
        ids = await _enqueue_work(redis, 60, 40)

        async def done() -> bool:
            return await redis.hlen(DONE) == len(ids)

        await wait_until(done, within=90, interval=0.05, what="limited tasks done")
        assert int(await redis.get(MAX) or 0) == 2  # reached, never exceeded

        # Raised at runtime for the whole fleet: no restart.
        async with Inspector(redis) as insp:
            await insp.set_limit(Q, 5)
        await redis.delete(MAX, DONE)
        ids = await _enqueue_work(redis, 150, 40)
        await wait_until(done, within=90, interval=0.05, what="tasks under the raised limit")
        assert int(await redis.get(MAX) or 0) == 5
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            stop_process(proc)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_killed_workers_expired_lease_does_not_hold_the_limit(
    redis_url: str, redis: Redis
) -> None:
    # The recoverer would only touch the dead lease a minute after it expired.
    timings = ["lease=2", "heartbeat=0.3", "recoverer_interval=60", "recoverer_cutoff=60"]
    victim = spawn("flow_worker.py", redis_url, "concurrency=5", f"limits={Q}:1", *timings)
    other: subprocess.Popen[str] | None = None
    try:
        await wait_for_line(victim, READY)
        drain(victim)  # it logs every task: keep its pipes from filling
        async with Client(redis) as client:
            blocked = await client.enqueue(Task("block", b"", queue=Q))
        await wait_until(
            lambda: redis.lrange(STARTS, 0, -1), within=20, what="blocking task started"
        )
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)
        killed_at = time.time()
        ids = await _enqueue_work(redis, 1, 0)
        other = spawn("flow_worker.py", redis_url, "concurrency=5", f"limits={Q}:1", *timings)
        await wait_for_line(other, READY)
        drain(other)  # it logs every task: keep its pipes from filling

        async def done() -> bool:
            # Acknowledged too (its hash deleted): the handler writes DONE before the ack
            # takes the task out of the active list checked below.
            finished = await redis.hlen(DONE) == len(ids)
            return finished and not await redis.exists(*(keys.task_key(Q, i) for i in ids))

        await wait_until(done, within=30, interval=0.05, what="task behind the dead lease")
        # It ran once the dead lease expired (2 s), long before any recovery.
        assert time.time() - killed_at < 30
        assert (await redis.lrange(keys.active_key(Q), 0, -1)) == [blocked.id.encode()]
    finally:
        stop_process(victim)
        if other is not None:
            stop_process(other)


# -- RateLimited -------------------------------------------------------------------------------


def test_rate_limited_refuses_bad_delays() -> None:
    with pytest.raises(TypeError, match=r"retry_in must be a datetime\.timedelta"):
        RateLimited(retry_in=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot be negative"):
        RateLimited(retry_in=timedelta(seconds=-1))


async def test_rate_limited_reschedules_without_using_a_retry(redis: Redis) -> None:
    attempts: list[int] = []
    errors: list[BaseException] = []

    async def handle(task: Task) -> None:
        attempts.append(task.retry_count)
        if len(attempts) == 1:
            raise ValueError("a real failure")  # uses one retry
        if len(attempts) <= 4:
            raise RuntimeError("partner said 429") from RateLimited(retry_in=timedelta(0))

    mux = ServeMux()
    mux.handle("limited", handle)
    server = Server(
        redis,
        queues={Q: 1},
        retry_delay=lambda n, e, t: timedelta(0),
        error_handler=lambda task, exc: errors.append(exc),
        **FAST,
    )
    async with Client(redis) as client:
        info = await client.enqueue(Task("limited", b"", queue=Q), max_retry=1)
    async with server:
        await server.start(mux)
        await wait_until(lambda: len(attempts) >= 5, within=30, what="five attempts")

        async def gone() -> bool:
            return await redis.exists(keys.task_key(Q, info.id)) == 0

        await wait_until(gone, within=30, what="task done")
    # One real failure used the only retry; the rate-limited runs used none, so the
    # task still ran (max_retry=1 would have archived it on a counted failure).
    assert attempts == [0, 1, 1, 1, 1]
    assert [type(e) for e in errors] == [ValueError]
    assert int(await redis.get(keys.failed_total_key(Q)) or 0) == 1


# -- visible -----------------------------------------------------------------------------------


async def test_limit_shows_in_metrics_web_and_cli(redis_url: str, redis: Redis) -> None:
    import httpx
    from click.testing import CliRunner

    from asyncq.cli import main
    from asyncq.metrics import collect_queue_metrics, render
    from asyncq.web import create_app

    await _fill(redis, 5)
    mq = MultiQueue(Broker(redis))
    assert len((await mq.dequeue([Q], 1)).tasks) == 1
    runner = CliRunner()
    res = await asyncio.to_thread(runner.invoke, main, ["-u", redis_url, "queue", "limit", Q, "3"])
    assert res.exit_code == 0, res.output
    assert "to 3 running tasks fleet-wide" in res.output
    res = await asyncio.to_thread(runner.invoke, main, ["-u", redis_url, "queue", "limit", Q])
    assert "at most 3 running tasks" in res.output
    res = await asyncio.to_thread(runner.invoke, main, ["-u", redis_url, "queue", "inspect", Q])
    assert "Limit: 3 running fleet-wide    Running: 1    Held back by the limit: 2" in res.output
    res = await asyncio.to_thread(
        runner.invoke, main, ["-u", redis_url, "queue", "limit", "nosuchqueue", "3"]
    )
    # Stored for a queue with no task yet (README: the command stores the setting), and
    # said so, which also shows a mistyped name.
    assert res.exit_code == 0, res.output
    assert res.output == (
        'Limited queue "nosuchqueue" to 3 running tasks fleet-wide '
        "(the queue has no task yet: the setting applies when its tasks come)\n"
    )

    async with Inspector(redis) as insp:
        text = render(await collect_queue_metrics(insp)).decode()
    assert f'asyncq_queue_concurrency_limit{{queue="{Q}"}} 3.0' in text
    assert f'asyncq_queue_running{{queue="{Q}"}} 1.0' in text
    assert f'asyncq_queue_held_back{{queue="{Q}"}} 2.0' in text

    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        page = await http.get(f"/queues/{Q}")
        assert page.status_code == 200
        assert "Limit (fleet-wide)" in page.text and "Held back by the limit" in page.text
        data = (await http.get(f"/api/queues/{Q}")).json()["queue"]
    assert (data["concurrency_limit"], data["running"], data["held_back"]) == (3, 1, 2)

    res = await asyncio.to_thread(
        runner.invoke, main, ["-u", redis_url, "queue", "limit", Q, "--clear"]
    )
    assert res.exit_code == 0 and "Cleared" in res.output


async def test_server_local_limit_bounds_one_process(redis: Redis) -> None:
    running = 0
    peak = 0
    done = 0

    async def handle(task: Task) -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        done += 1

    mux = ServeMux()
    mux.handle("work", handle)
    await _fill(redis, 30)
    server = Server(
        redis, concurrency=10, queues={Q: 1}, limits=Limits(local_queue_concurrency={Q: 2}), **FAST
    )
    async with server:
        await server.start(mux)
        await wait_until(lambda: done == 30, within=30, what="all tasks")
    assert peak == 2


# -- rate limits -------------------------------------------------------------------------------


def test_rates_parse_and_refuse_bad_input() -> None:
    from asyncq._worker.limits import parse_rate

    assert parse_rate("100/s").interval_us == 10_000
    assert parse_rate("600/min").interval_us == 100_000
    assert parse_rate(" 10 / H ").count == 10
    for bad in ("100", "0/s", "1/week", "x/s", "-1/s", "1.5/s"):
        with pytest.raises(ValueError, match="bad rate"):
            parse_rate(bad)
    with pytest.raises(ValueError, match="rate_limits: queue 'email'"):
        Server("redis://localhost:1", rate_limits={"email": "fast"})
    with pytest.raises(TypeError, match="rate_limits must be a mapping"):
        Server("redis://localhost:1", rate_limits=["email"])  # type: ignore[arg-type]

    from click.testing import CliRunner

    from asyncq.cli import main

    for bad in ("email", "email=100", "=1/s"):
        res = CliRunner().invoke(main, ["worker", "x:y", "--rate-limit", bad])
        assert res.exit_code == 2 and "--rate-limit" in res.output, res.output


async def test_rate_bucket_gives_the_burst_then_holds_without_starving_others(
    redis_url: str, redis: Redis
) -> None:
    from click.testing import CliRunner

    from asyncq.cli import main

    await _fill(redis, 10)
    await _fill(redis, 3, queue="default")
    mq = MultiQueue(Broker(redis))
    rate = (-1, -1, 3_600_000_000 // 4, 4)  # 4/h: a full bucket of 4, then nothing for a while
    got = await mq.dequeue([Q, "default"], 10, limits={Q: rate})
    by_queue = [t.message.queue for t in got.tasks]
    assert by_queue.count(Q) == 4 and by_queue.count("default") == 3
    assert got.held == {Q} and Q not in got.empty
    again = await mq.dequeue([Q, "default"], 10, limits={Q: rate})
    assert again.tasks == [] and again.held == {Q}
    # The bucket lives in Redis under the queue's hash tag, with an expiry.
    assert await redis.pttl(f"asynq:{{{Q}}}:asyncq:rate") > 0
    assert await redis.llen(keys.pending_key(Q)) == 6
    async with Inspector(redis) as insp:
        info = await insp.queue_info(Q)
    assert (info.rate_limit, info.rate_tokens) == ("4/h", 0)
    res = await asyncio.to_thread(
        CliRunner().invoke, main, ["-u", redis_url, "queue", "inspect", Q]
    )
    assert "Rate limit: 4/h    Tokens now: 0" in res.output, res.output


async def test_rate_bucket_state_is_in_redis_time_microseconds(redis: Redis) -> None:
    await _fill(redis, 3)
    mq = MultiQueue(Broker(redis))
    interval = 3_600_000_000 // 4  # 4/h
    got = await mq.dequeue([Q], 1, limits={Q: (-1, -1, interval, 4)})
    assert len(got.tasks) == 1
    secs, micros = await redis.time()
    now_us = secs * 1_000_000 + micros
    # one task taken from a full bucket: its theoretical arrival time is now + one interval
    tat = int(await redis.hget(f"asynq:{{{Q}}}:asyncq:rate", "tat"))
    assert now_us - 5_000_000 <= tat - interval <= now_us
    async with Inspector(redis) as insp:
        info = await insp.queue_info(Q)
    assert (info.rate_limit, info.rate_tokens) == ("4/h", 3)


async def test_a_rate_key_of_another_type_stops_the_fetch_before_its_queue(
    redis: Redis,
) -> None:
    # The rate key is checked with the queue's other keys: what the call took from the
    # queues before it is kept and returned, and nothing of the damaged queue moves.
    first = await _fill(redis, 1, queue="default")
    await _fill(redis, 2)
    await redis.set(f"asynq:{{{Q}}}:asyncq:rate", "damaged")
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue(["default", Q], 5, limits={Q: (-1, -1, 1_000_000, 5)})
    assert [t.message.id for t in got.tasks] == first
    assert await redis.llen(keys.pending_key(Q)) == 2
    assert await redis.llen(keys.active_key(Q)) == 0


async def test_a_limit_key_of_another_type_stops_the_fetch_before_its_rated_queue(
    redis: Redis,
) -> None:
    # A queue with a rate has its limit key checked too: the call keeps what it took
    # before that queue.
    first = await _fill(redis, 1, queue="default")
    await _fill(redis, 2)
    await redis.hset(f"asynq:{{{Q}}}:asyncq:limit", "x", "y")
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue(["default", Q], 5, limits={Q: (-1, -1, 1_000_000, 5)})
    assert [t.message.id for t in got.tasks] == first
    assert await redis.llen(keys.pending_key(Q)) == 2


async def test_a_rate_key_of_another_type_is_not_read_without_a_rate(redis: Redis) -> None:
    # Only the keys a fetch uses are checked: a queue with no rate is served whatever
    # its rate key holds.
    ids = await _fill(redis, 2)
    await redis.set(f"asynq:{{{Q}}}:asyncq:rate", "damaged")
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q], 5)
    assert sorted(t.message.id for t in got.tasks) == sorted(ids)


async def test_a_byte_budget_of_zero_takes_only_a_free_first_task(redis: Redis) -> None:
    # The fetch loop's budget runs down to 0 (bytes already in flight): nothing more
    # fits, unless nothing is in flight and the first task may exceed it.
    ids = await _fill(redis, 3)
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q], 10, max_bytes=0, first_free=False)
    assert got.tasks == []
    got = await mq.dequeue([Q], 10, max_bytes=0, first_free=True)
    assert [t.message.id for t in got.tasks] == ids[:1]
    assert await redis.llen(keys.pending_key(Q)) == 2


async def test_a_limit_of_zero_holds_the_queue(redis: Redis) -> None:
    await _fill(redis, 3)
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q], 10, limits={Q: (0, -1)})
    assert got.tasks == [] and got.held == {Q}
    async with Inspector(redis) as insp:
        await insp.set_limit(Q, 0)  # stored: no configured limit needed
    got = await mq.dequeue([Q], 10)
    assert got.tasks == [] and got.held == {Q}
    assert await redis.llen(keys.pending_key(Q)) == 3


async def test_rate_bucket_refills_with_redis_time(redis: Redis) -> None:
    await _fill(redis, 20)
    mq = MultiQueue(Broker(redis))
    rate = (-1, -1, 100_000, 2)  # 10/s, bucket of 2
    assert len((await mq.dequeue([Q], 20, limits={Q: rate})).tasks) == 2
    assert (await mq.dequeue([Q], 20, limits={Q: rate})).tasks == []
    await asyncio.sleep(0.25)
    assert len((await mq.dequeue([Q], 20, limits={Q: rate})).tasks) == 2  # refilled, capped


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_rate_limit_over_three_workers(redis_url: str, redis: Redis) -> None:
    rate, n, concurrency = 50, 300, 4
    burst = rate  # "50/s" holds 50 tokens
    # A task counts when its handler stamps Redis TIME, a little after its fetch.
    # A window of stamps can hold, beyond the tasks fetched in it, only tasks that
    # were fetched earlier and not yet started: at most the fleet's slots.
    in_flight = 3 * concurrency
    procs = _workers(redis_url, 3, f"concurrency={concurrency}", f"rate={Q}:{rate}/s")
    try:
        for proc in procs:
            await wait_for_line(proc, READY)
            drain(proc)  # it logs every task: keep its pipes from filling
        async with Client(redis) as client:
            await client.enqueue_many([Task("stamp", b"", queue=Q) for _ in range(n)])

        async def done() -> bool:
            return await redis.llen(STAMPS) == n

        await wait_until(done, within=120, interval=0.1, what="rate-limited tasks done")
        stamps = sorted(int(s) for s in await redis.lrange(STAMPS, 0, -1))
        # Every one-second window (by Redis time) holds at most burst + rate starts.
        most = 0
        j = 0
        for i, start in enumerate(stamps):
            while j < len(stamps) and stamps[j] < start + 1_000_000:
                j += 1
            most = max(most, j - i)
        assert most <= burst + rate + in_flight
        assert most >= rate  # the rate is reached
        # Over the whole run the bucket bounds the total: n <= burst + rate * span
        # (one bucket per worker would allow three times that).
        span = (stamps[-1] - stamps[0]) / 1_000_000
        assert n <= burst + rate * span + in_flight
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            stop_process(proc)


# -- ordered queues ----------------------------------------------------------------------------


async def test_ordered_queue_takes_one_task_and_holds_behind_a_retry(
    redis_url: str, redis: Redis
) -> None:
    from click.testing import CliRunner

    from asyncq.cli import main

    ids = await _fill(redis, 5)
    await _fill(redis, 2, queue="default")
    runner = CliRunner()
    res = await asyncio.to_thread(
        runner.invoke, main, ["-u", redis_url, "queue", "ordered", Q, "on"]
    )
    assert res.exit_code == 0 and "now ordered" in res.output, res.output
    mq = MultiQueue(Broker(redis))
    got = await mq.dequeue([Q, "default"], 10)
    assert [t.message.id for t in got.tasks if t.message.queue == Q] == [ids[0]]
    assert len(got.tasks) == 3 and got.held == {Q}  # the other queue is not starved
    assert (await mq.dequeue([Q], 10)).tasks == []  # one at a time
    # The head fails: it goes to the retry set; nothing behind it starts meanwhile.
    await redis.lrem(keys.active_key(Q), 1, ids[0])
    await redis.zrem(keys.lease_key(Q), ids[0])
    await redis.zadd(keys.retry_key(Q), {ids[0]: int(time.time()) - 1})
    assert (await mq.dequeue([Q], 1)).tasks == []
    assert (await mq.dequeue([Q], 10)).tasks == []
    assert await mq.forward([Q]) == 1  # back at the end of pending taken next
    again = await mq.dequeue([Q], 10)
    assert [t.message.id for t in again.tasks] == [ids[0]]
    async with Inspector(redis) as insp:
        assert (await insp.queue_info(Q)).ordered
        await insp.set_ordered(Q, False)
        assert not await insp.ordered(Q)
    res = await asyncio.to_thread(runner.invoke, main, ["-u", redis_url, "queue", "inspect", Q])
    assert "Ordered" not in res.output


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_ordered_queue_runs_in_enqueue_order_despite_failures_and_a_kill(
    redis_url: str, redis: Redis
) -> None:
    n = 500
    # A live worker's lease must outlast whatever stalls a loaded machine puts between its
    # heartbeats: one that expired would have its task run again by another worker, after
    # the next tasks, while its own run may still log it. Only the killed worker's expires.
    timings = ["lease=10", "heartbeat=1", "recoverer_interval=1", "recoverer_cutoff=1"]
    opts = ["concurrency=10", f"ordered={Q}", "forward=0.1", *timings]
    procs = _workers(redis_url, 3, *opts)
    try:
        for proc in procs:
            await wait_for_line(proc, READY)
            drain(proc)  # it logs every task: keep its pipes from filling
        async with Client(redis) as client:
            infos = await client.enqueue_many(
                [
                    Task("seq", b"fail" if i % 37 == 5 else b"ok", queue=Q, max_retry=25)
                    for i in range(n)
                ]
            )
        ids = [info.id for info in infos]  # type: ignore[union-attr]

        async def some() -> bool:
            return await redis.llen(LOG) >= n // 3

        await wait_until(some, within=120, interval=0.05, what="a third of the tasks done")
        # SIGKILL the worker that runs the current head, mid-task if it is running one.
        victim = procs[0]
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)
        procs[0] = spawn("flow_worker.py", redis_url, *opts)

        async def done() -> bool:
            return len(set(await redis.lrange(LOG, 0, -1))) == n

        await wait_until(done, within=240, interval=0.1, what="ordered tasks done")
        log = [x.decode() for x in await redis.lrange(LOG, 0, -1)]
        # A task whose worker died after its handler logged it runs again at once
        # (at-least-once); that repeat is adjacent. Otherwise: exactly enqueue order.
        runs = [x for i, x in enumerate(log) if i == 0 or log[i - 1] != x]
        assert runs == ids
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:  # a loaded machine can take a while to shut three workers down
            assert await asyncio.to_thread(proc.wait, 90) == 0
    finally:
        for proc in procs:
            stop_process(proc)
