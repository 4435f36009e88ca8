"""Readers of asyncq's own keys meet values no asyncq writer stores (issue 39, item 4):
each answers with what it can and names the damaged key, once, in a warning.

Found by ``test_fuzz_asyncq_keys.py``; each case here failed a reader before its fix
(the test names which).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from asyncq import Client, Inspector, Task, WorkflowNotFoundError
from asyncq import _keys as keys
from asyncq.errors import BrokerError
from asyncq.events import read_events, recent_events
from asyncq.web import create_app

Q = "q"
GARBAGE = [b"", b"nan", b"inf", b"1e300", b"-100", b"9" * 40, b"0x10", b"\xff\xfe", b"1.5"]


def _naming(logs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("log_level") == "warning" and e.get("key") == key]


async def _queue(redis: Redis) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("t"), queue=Q, task_id="a")


@pytest.mark.parametrize("value", GARBAGE)
async def test_a_garbage_limit_is_named_and_reads_as_none(
    redis: Redis, redis_url: str, value: bytes
) -> None:
    # Before: queue_info raised ValueError/UnicodeDecodeError, and with it /api/queues,
    # the home page, /metrics and `asyncq stats` for every queue.
    await _queue(redis)
    await redis.set(keys.limit_key(Q), value)
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            info = await insp.queue_info(Q)
    assert info.concurrency_limit is None
    assert info.pending == 1
    assert len(_naming(logs, keys.limit_key(Q))) == 1, logs


@pytest.mark.parametrize("kind", ["list", "hash"])
async def test_flow_keys_of_another_type_are_named(redis: Redis, kind: str) -> None:
    # Before: WRONGTYPE from queue_info (502 on the queue's page, `stats` exited 1).
    await _queue(redis)
    for key in (keys.limit_key(Q), keys.ordered_key(Q), keys.rate_key(Q)):
        if kind == "list":
            await redis.rpush(key, "x")
        else:
            await redis.hset(key, "x", "y")
    if kind == "hash":  # a hash is the rate bucket's own type: make it another
        await redis.delete(keys.rate_key(Q))
        await redis.set(keys.rate_key(Q), "x")
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            info = await insp.queue_info(Q)
    assert (info.concurrency_limit, info.ordered, info.rate_limit) == (None, False, None)
    for key in (keys.limit_key(Q), keys.ordered_key(Q), keys.rate_key(Q)):
        assert len(_naming(logs, key)) == 1, (key, logs)


@pytest.mark.parametrize("field", ["tat", "interval", "burst", "limited"])
@pytest.mark.parametrize("value", [b"nan", b"inf", b"", b"\xff", b"1.5", b"9" * 40])
async def test_a_garbage_type_rate_bucket_is_named(redis: Redis, field: str, value: bytes) -> None:
    # Before: Inspector.type_rate (and `asyncq typerate`, /api/type-rates) raised.
    key = keys.type_rate_key("t")
    bucket = {"tat": "0", "interval": "1000", "burst": "5", "limited": "0", field: value}
    await redis.hset(key, mapping=bucket)  # type: ignore[arg-type]
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            assert await insp.type_rate("t") is None
    assert len(_naming(logs, key)) == 1, logs


async def test_a_rate_bucket_of_no_token_is_named(redis: Redis) -> None:
    # Before: ZeroDivisionError in type_rate (tasks per second of a 0-token bucket).
    key = keys.type_rate_key("t")
    await redis.hset(key, mapping={"tat": "0", "interval": "1000", "burst": "0"})
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            assert await insp.type_rate("t") is None
    assert len(_naming(logs, key)) == 1, logs


@pytest.mark.parametrize(
    "stored",
    [
        {"fraction": "0.5", "time": "inf"},
        {"fraction": "0.5", "time": "1e300"},
        {"fraction": "nan", "time": "1"},
        {"fraction": "3", "time": "1"},
        {"fraction": b"\xff", "time": "1"},
        {"message": "no fraction"},
        "a string",
    ],
)
async def test_garbage_progress_is_named_and_the_task_still_reads(
    redis: Redis, redis_url: str, stored: Any
) -> None:
    # Before: get_task raised OverflowError (time inf) or WRONGTYPE (a string), so did
    # the task's page and `task inspect`; a nan or 300 % fraction was dropped unnamed.
    await _queue(redis)
    # Running, as a dequeue leaves it: the active listing reads progress too.
    await redis.lmove(keys.pending_key(Q), keys.active_key(Q), "RIGHT", "LEFT")
    await redis.hset(keys.task_key(Q, "a"), "state", "active")
    await redis.zadd(keys.lease_key(Q), {"a": time.time() + 60})
    key = keys.progress_key(Q, "a")
    if isinstance(stored, str):
        await redis.set(key, stored)
    else:
        await redis.hset(key, mapping=stored)
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            assert (await insp.get_task(Q, "a")).progress is None
            assert [t.progress for t in await insp.list_tasks(Q, "active")] == [None]
    # One warning per read: get_task and the listing each read it once.
    assert len(_naming(logs, key)) == 2, logs
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as web,
    ):
        assert (await web.get(f"/api/queues/{Q}/tasks/a")).status_code == 200


@pytest.mark.parametrize("value", [b"nan", b"-1", b"1.5", b"\xff", b"9" * 30])
async def test_garbage_metrics_history_counts_are_named(redis: Redis, value: bytes) -> None:
    # Before: metrics_history raised ValueError (and /api/history, `metrics top` failed).
    await _queue(redis)
    minute = int(time.time()) // 60
    good, bad = keys.metrics_history_key(Q, minute), keys.metrics_history_key(Q, minute - 1)
    await redis.hset(good, mapping={"p:t": "2"})
    await redis.hset(bad, mapping={"p:t": value, "f:t": "1"})
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            (row,) = await insp.metrics_history(Q)
    assert (row.processed, row.failed) == (2, 1)
    assert len(_naming(logs, bad)) == 1, logs


async def test_a_metrics_history_key_of_another_type_is_named(redis: Redis) -> None:
    # Before: the whole pipeline failed with WRONGTYPE: no history for any queue.
    await _queue(redis)
    minute = int(time.time()) // 60
    good, bad = keys.metrics_history_key(Q, minute), keys.metrics_history_key(Q, minute - 1)
    await redis.hset(good, mapping={"p:t": "2"})
    await redis.set(bad, "x")
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            (row,) = await insp.metrics_history(Q)
    assert row.processed == 2
    assert len(_naming(logs, bad)) == 1, logs


async def test_an_event_stream_of_another_type_is_named(redis: Redis, redis_url: str) -> None:
    # Before: /api/events and the Events page answered 502 with Redis's bare WRONGTYPE,
    # and a live reader raised it unnamed.
    await redis.set(keys.EVENTS_KEY, "x")
    with capture_logs() as logs:
        found = await recent_events(redis, count=10)
    assert (found.events, found.skipped) == ([], [])
    assert len(_naming(logs, keys.EVENTS_KEY)) == 1, logs
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as web,
    ):
        assert (await web.get("/api/events")).status_code == 200
    with pytest.raises(BrokerError, match=keys.EVENTS_KEY):
        await anext(aiter(read_events(redis, since="0", block=0.01)))


@pytest.mark.parametrize(
    "stored",
    [
        {"state": "running", "stages": "nan"},
        {"state": "running", "stages": "1", "n:0": "1e9"},
        {"state": b"\xff", "stages": "0", b"\xfe": "x"},
        {"state": "running", "stages": "0", "created": "inf", "finished": "x", "ttl": "9" * 30},
        {"state": "running", "stages": "999999999999"},
    ],
)
async def test_a_garbage_workflow_record_reads_as_far_as_it_goes(
    redis: Redis, stored: dict[Any, Any]
) -> None:
    # Before: ValueError/UnicodeDecodeError/OverflowError from get_workflow and the
    # workflow listing, and a stage count of a billion looped without end.
    key = f"{keys.queue_key_prefix(Q)}wf:w"
    await redis.hset(key, mapping=stored)
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            info = await insp.get_workflow(Q, "w")
            assert sum(len(s) for s in info.stages) <= len(stored)
            assert [w.id for w in (await insp.workflows(Q)).workflows] == ["w"]
    assert len(_naming(logs, key)) in (0, 2), logs  # undecodable text alone is shown as U+FFFD
    if any(f in stored for f in ("created", "n:0")) or stored.get("stages") != "0":
        assert len(_naming(logs, key)) == 2, logs


async def test_a_workflow_record_of_another_type_is_named(redis: Redis) -> None:
    key = f"{keys.queue_key_prefix(Q)}wf:w"
    await redis.set(key, "x")
    with capture_logs() as logs:
        async with Inspector(redis) as insp:
            with pytest.raises(WorkflowNotFoundError):
                await insp.get_workflow(Q, "w")
            assert (await insp.workflows(Q)).workflows == []
    assert len(_naming(logs, key)) == 2, logs


@pytest.mark.parametrize("tat", [b"inf", b"nan", b"1e300", b"-5", b"\xff", b"9" * 30])
async def test_a_garbage_type_rate_tat_is_reset_and_named(broker: Any, tat: bytes) -> None:
    # Before: inf and 1e300 gave a wait beyond any date, so every task of the type failed
    # its bookkeeping and came back through the recoverer without end; nan failed the
    # script (PEXPIRE nan) and rescheduled every task of the type while the key lived.
    key = keys.type_rate_key("t")
    await broker.redis.hset(key, mapping={"tat": tat, "interval": "1000", "burst": "5"})
    with capture_logs() as logs:
        waits, _ = await broker.take_type_tokens(
            "t", 3, interval_us=1000, burst=5, max_wait_us=1_000_000
        )
    assert len(waits) == 3 and all(0 <= w <= 1_000_000 for w in waits), waits
    assert len(_naming(logs, key)) == 1, logs
    stored = await broker.redis.hget(key, "tat")
    assert stored.isdigit(), stored


async def test_a_garbage_limited_count_starts_again_and_is_named(broker: Any) -> None:
    # Before: HINCRBY failed the script after the bucket was written.
    key = keys.type_rate_key("t")
    sec, usec = await broker.redis.time()
    ahead = int(sec) * 1_000_000 + int(usec) + 10**11  # a day ahead: no token for now
    await broker.redis.hset(
        key, mapping={"tat": str(ahead), "interval": str(10**12), "burst": "1", "limited": "x"}
    )
    with capture_logs() as logs:
        waits, _ = await broker.take_type_tokens("t", 2, interval_us=10**12, burst=1, max_wait_us=0)
    assert waits == []
    assert await broker.redis.hget(key, "limited") == b"2"
    assert len(_naming(logs, key)) == 1, logs


async def test_a_type_rate_bucket_of_another_type_is_refused_by_name(broker: Any) -> None:
    key = keys.type_rate_key("t")
    await broker.redis.set(key, "x")
    with pytest.raises(Exception, match=r"asyncq:typerate:\{t\}"):
        await broker.take_type_tokens("t", 1, interval_us=1000, burst=1, max_wait_us=0)
    assert await broker.redis.get(key) == b"x"
