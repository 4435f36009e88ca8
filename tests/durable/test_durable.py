"""Durable functions end to end on a real server, with in-process workers: replay, steps
recorded once, waits that hold no slot, signals, sleeps, fan-out, failures, non-determinism."""

from __future__ import annotations

from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Server, TaskFailedError
from asyncq import _keys as keys
from asyncq._broker.durable import FAR_FUTURE
from tests.support import durable_app as d
from tests.support.helpers import wait_until


async def ran(redis: Redis) -> dict[str, int]:
    got = await redis.hgetall(d.RAN)
    return {k.decode(): int(v) for k, v in got.items()}


async def test_steps_replay_their_recorded_results(redis: Redis, worker: Server) -> None:
    handle = await d.chain3.start(4)
    assert await handle.result(timeout=20) == 55
    # three steps, each run once although the run replayed from the top four times
    assert await ran(redis) == {f"{handle.id}-{i}": 1 for i in range(3)}
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"state"] == b"succeeded"
    assert [record[f"s:{i}".encode()] for i in range(3)] == [
        b'step d:add {"a":4,"b":1}',
        b'step d:mul {"a":5,"b":10}',
        b'step d:add {"a":50,"b":5}',
    ]
    assert [record[f"r:{i}".encode()] for i in range(3)] == [b"5", b"50", b"55"]


async def parked(redis: Redis, run_id: str) -> float | None:
    """The run task's score in the scheduled set when it waits there, not active."""
    if await redis.lpos(keys.active_key(d.QUEUE), run_id) is not None:
        return None
    state = await redis.hget(keys.task_key(d.QUEUE, run_id), "state")
    if state != b"scheduled":
        return None
    score = await redis.zscore(keys.scheduled_key(d.QUEUE), run_id)
    return None if score is None else float(score)


async def test_gather_of_ten_enqueues_once_and_resumes_once(redis: Redis, worker: Server) -> None:
    handle = await d.fan.start(10)
    assert await handle.result(timeout=20) == [2 * i for i in range(10)]
    assert await ran(redis) == {f"{handle.id}-{i}": 1 for i in range(10)}
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert b"wait" not in record and b"missing" not in record


async def test_a_failed_step_is_raised_where_it_is_awaited(redis: Redis, worker: Server) -> None:
    handle = await d.caught.start()
    result = await handle.result(timeout=20)
    assert result.startswith("caught: ") and "boom 7" in result
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert b"boom 7" in record[b"e:0"]


async def test_a_signal_after_the_wait_resumes_the_run_which_held_no_slot(
    redis: Redis, worker: Server
) -> None:
    handle = await d.waiter.start("a", None)
    score = await wait_until(lambda: parked(redis, handle.id), what="the run parked")
    assert score == FAR_FUTURE  # no timeout: only the signal resumes it
    await wait_until(lambda: worker.running_tasks == 0, what="the slot given back")
    assert await redis.smembers(keys.awaiting_key(d.QUEUE, "go", "a")) == {
        f"{handle.id} 0".encode()
    }
    assert await d.app.signal("go", key="a", payload={"x": 1}) == 1
    assert await handle.result(timeout=20) == {"got": {"x": 1}}
    assert not await redis.exists(keys.awaiting_key(d.QUEUE, "go", "a"))


async def test_a_signal_before_the_wait_is_kept_for_it(redis: Redis, worker: Server) -> None:
    assert await d.app.signal("go", key="b", payload=5, keep=timedelta(minutes=1)) == 0
    kept = keys.signal_key(d.QUEUE, "go", "b")
    assert 0 < await redis.pttl(kept) <= 60_000
    handle = await d.waiter.start("b", None)
    assert await handle.result(timeout=20) == {"got": 5}
    assert not await redis.exists(kept)  # taken by that wait


async def test_a_wait_times_out_with_none(redis: Redis, worker: Server) -> None:
    handle = await d.waiter.start("c", 0.3)
    score = await wait_until(lambda: parked(redis, handle.id), what="the run parked")
    assert score < FAR_FUTURE  # its timeout resumes it
    assert await handle.result(timeout=20) == {"got": None}
    # the wait is over: a late signal finds no waiter and is kept
    assert await d.app.signal("go", key="c", payload=1) == 0
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"r:0"] == b""


async def test_a_sleep_parks_the_run_until_its_end(redis: Redis, worker: Server) -> None:
    handle = await d.sleeper.start(0.5)
    score = await wait_until(lambda: parked(redis, handle.id), what="the run parked")
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert score == int(float(record[b"d:1"])) + 1  # due at the sleep's end
    await wait_until(lambda: worker.running_tasks == 0, what="the slot given back")
    slept = await handle.result(timeout=20)
    assert slept >= 0.5  # run.now() after the sleep, recorded once, minus the one before


async def test_a_local_call_runs_once_and_values_are_recorded_once(
    redis: Redis, worker: Server
) -> None:
    handle = await d.recorded_call.start(5)
    total, same, token = await handle.result(timeout=20)
    assert total == 16 and same is False  # two uuid() entries: two values
    assert await redis.hgetall(d.CALLS) == {b"5": b"1"}  # not called again by the replay
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"r:1"].decode() == token.replace("-", "")


async def test_a_child_run_is_a_step(redis: Redis, worker: Server) -> None:
    handle = await d.parent.start(1)
    assert await handle.result(timeout=20) == 102
    assert await ran(redis) == {f"{handle.id}-0-0": 1}


async def test_non_determinism_fails_the_run_naming_both(redis: Redis, worker: Server) -> None:
    handle = await d.fickle.start()
    awaiting = keys.awaiting_key(d.QUEUE, "fickle", "k")
    await wait_until(lambda: redis.sismember(awaiting, f"{handle.id} 1"), what="the run waiting")
    d.flip["on"] = True  # the code now asks for another first step
    assert await d.app.signal("fickle", key="k") == 1
    with pytest.raises(TaskFailedError) as err:
        await handle.result(timeout=20)
    message = err.value.last_error
    assert 'step d:add {"a":2,"b":3}' in message and 'step d:mul {"a":2,"b":3}' in message
    assert "entry 0" in message
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"state"] == b"failed"


async def test_the_onboarding_drip(redis: Redis, worker: Server) -> None:
    timed_out = await d.onboard.start(3)
    assert await timed_out.result(timeout=30) == "done 135 opened=False"
    assert await d.app.signal("opened", key="4", payload={"at": "now"}) == 0
    opened = await d.onboard.start(4)
    assert await opened.result(timeout=30) == "done 180 opened=True"
    counts = await ran(redis)
    assert all(n == 1 for n in counts.values())
    assert len([k for k in counts if k.startswith(timed_out.id)]) == 12
    assert len([k for k in counts if k.startswith(opened.id)]) == 11
