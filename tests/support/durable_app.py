"""Durable functions and their step tasks for the durable tests (imported by the tests and
by ``asyncq worker tests.support.durable_app:app`` in a subprocess).

Every step task counts its runs in the hash :data:`RAN` (field: the step's task id), so a
test can tell a step that ran twice from one that ran once; :data:`CALLS` counts the
local calls of :func:`recorded_call`; :func:`slow` also lists its starts with the worker's
pid in :data:`STARTS` (``"<task id> <pid>"``) and counts all its side effects in
:data:`RAN_TOTAL` (what the kill test polls, cheaper than summing :data:`RAN`), for the
kill test's ledger.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from datetime import timedelta

from redis.asyncio import Redis

from asyncq import App, Run, Server, TaskFailedError, current_task
from tests.support.procs import FAST_INTERVALS

RAN = "durable-test:ran"
RAN_TOTAL = "durable-test:ran-total"
STARTS = "durable-test:starts"
CALLS = "durable-test:calls"
QUEUE = "durable"
ELSEWHERE = "durable-elsewhere"
"""A second queue of the worker: a step there is not the run's queue's, so it never runs
inline (in its run's attempt's slot): its run suspends, and continues after it."""

app = App(os.environ.get("TEST_REDIS_URL", "redis://localhost:6379/0"))


async def start_worker() -> Server:
    """An in-process worker of the App's queue, started (shut it down after)."""
    server = app.server(
        queues={QUEUE: 1, ELSEWHERE: 1},
        concurrency=4,
        intervals=FAST_INTERVALS,
        shutdown_timeout=timedelta(seconds=2),
    )
    await server.start(app.mux)
    return server


flip = {"on": False}
"""Read by :func:`fickle`: the test flips it between two replays (in-process workers)."""


async def _count(key: str, field: str) -> None:
    async with Redis.from_url(str(app.redis)) as r:
        await r.hincrby(key, field, 1)


@app.task(name="d:add", queue=QUEUE)
async def add(a: int, b: int) -> int:
    await _count(RAN, current_task().id or "")
    return a + b


@app.task(name="d:mul", queue=QUEUE)
async def mul(a: int, b: int) -> int:
    await _count(RAN, current_task().id or "")
    return a * b


@app.task(name="d:boom", queue=QUEUE, max_retry=0)
async def boom(n: int) -> int:
    await _count(RAN, current_task().id or "")
    raise ValueError(f"boom {n}")


@app.durable(name="d:chain", queue=QUEUE)
async def chain3(run: Run, n: int) -> int:
    x = await run.step(add, n, 1)
    y = await run.step(mul, x, 10)
    return await run.step(add, y, 5)


@app.durable(name="d:fan", queue=QUEUE)
async def fan(run: Run, n: int) -> list[int]:
    return await run.gather(*(run.step(mul, i, 2) for i in range(n)))


@app.durable(name="d:caught", queue=QUEUE)
async def caught(run: Run) -> str:
    try:
        await run.step(boom, 7)
    except TaskFailedError as exc:
        return f"caught: {exc.last_error}"
    return "not raised"


@app.durable(name="d:waiter", queue=QUEUE)
async def waiter(run: Run, key: str, timeout_s: float | None) -> object:
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    got = await run.wait_for("go", key=key, timeout=timeout)
    return {"got": got}


@app.durable(name="d:sleeper", queue=QUEUE)
async def sleeper(run: Run, seconds: float) -> float:
    began = run.now()
    await run.sleep(timedelta(seconds=seconds))
    done = await run.step(add, 1, 1)
    return (run.now() - began).total_seconds() + done * 0


async def side_effect(n: int) -> int:
    await _count(CALLS, str(n))
    return n * 3


@app.durable(name="d:recorded_call", queue=QUEUE)
async def recorded_call(run: Run, n: int) -> list[object]:
    tripled = await run.call(side_effect, n)
    token = run.uuid()
    total = await run.step(add, tripled, 1)
    return [total, str(token) == str(run.uuid()), str(token)]


@app.durable(name="d:fickle", queue=QUEUE)
async def fickle(run: Run) -> int:
    first = await run.step(mul if flip["on"] else add, 2, 3)
    await run.wait_for("fickle", key="k")
    return first


@app.durable(name="d:child", queue=QUEUE)
async def child(run: Run, n: int) -> int:
    return await run.step(add, n, 100)


@app.durable(name="d:parent", queue=QUEUE)
async def parent(run: Run, n: int) -> int:
    return await run.step(child, n) + 1


@app.durable(name="d:onboard", queue=QUEUE)
async def onboard(run: Run, user: int) -> str:
    """The issue's drip, short: steps, a signal wait with timeout, a sleep, a fan-out."""
    await run.step(add, user, 0)
    opened = await run.wait_for("opened", key=str(user), timeout=timedelta(seconds=1))
    if opened is None:
        await run.sleep(timedelta(milliseconds=200))
        await run.step(add, user, 1)
    scores = await run.gather(*(run.step(mul, i, user) for i in range(10)))
    return f"done {sum(scores)} opened={opened is not None}"


@app.task(name="d:slow", queue=QUEUE)
async def slow(i: int, ms: int) -> int:
    """Starts (listed), works *ms*, then does its side effect (counted) and returns *i*."""
    async with Redis.from_url(str(app.redis)) as r:
        await r.rpush(STARTS, f"{current_task().id} {os.getpid()}")
        await asyncio.sleep(ms / 1000)
        async with r.pipeline(transaction=True) as pipe:
            pipe.hincrby(RAN, current_task().id or "", 1).incr(RAN_TOTAL)
            await pipe.execute()
    return i


@app.durable(name="d:crashy", queue=QUEUE, retention=timedelta(hours=1))
async def crashy(run: Run, n: int) -> int:
    """The kill test's run: 5 steps, a sleep, a signal wait (that times out), a fan-out of
    10; returns 155 (+ the signal's payload if one came: the kill test signals every
    other run before it starts, so the wait takes the kept signal)."""
    total = 0
    for i in range(5):
        total += await run.step(slow, i, 40)
    await run.sleep(timedelta(milliseconds=300))
    got = await run.wait_for("crashy", key=str(n), timeout=timedelta(milliseconds=300))
    scores = await run.gather(*(run.step(slow, 10 + i, 30) for i in range(10)))
    return total + sum(scores) + (0 if got is None else int(got))


hold = {"gate": asyncio.Event()}
"""Opened by the test: :func:`held` (a local call of :func:`held_run`) waits for it, so an
attempt of the run stays active (the cancel test's running run)."""


async def held() -> int:
    await _count(CALLS, "held")
    await hold["gate"].wait()
    return 1


@app.durable(name="d:held", queue=QUEUE)
async def held_run(run: Run) -> int:
    await run.step(add, 1, 2)
    return await run.call(held)


@app.durable(name="d:held-first", queue=QUEUE)
async def held_first(run: Run) -> int:
    """Held in its first attempt: its record still says pending (as its start wrote it)."""
    return await run.call(held)


entered: list[str] = []
"""Run ids of :func:`counted`, once each time its function is entered from the top (a
first attempt or a replay; not an attempt that resumes its parked coroutine)."""
unwound: list[str] = []
"""Run ids of :func:`counted`, once each time its function is left while waiting (its
``finally``, run when a suspension unwinds it or its parked coroutine is discarded)."""
gate = {"open": asyncio.Event()}
"""Opened by the test: :func:`gated` (a step of :func:`counted`) waits for it."""


@app.task(name="d:gated", queue=QUEUE)
async def gated(n: int) -> int:
    await gate["open"].wait()
    return n + 100


@app.durable(name="d:counted", queue=QUEUE)
async def counted(run: Run, n: int, first_gated: bool) -> int:
    """Its steps run in :data:`ELSEWHERE`: it parks on each, and continues after it."""
    entered.append(run.id)
    try:
        if first_gated:
            n = await run.step(gated.options(queue=ELSEWHERE), n)
        for _ in range(3):
            n = await run.step(add.options(queue=ELSEWHERE), n, 1)
    except BaseException:
        unwound.append(run.id)
        await asyncio.sleep(0)  # an async exit, as an `async with` spanning steps has
        raise
    return n


async def _awaited(step: Awaitable[int]) -> int:
    return await step


@app.durable(name="d:grouped", queue=QUEUE)
async def grouped(run: Run, n: int) -> list[int]:
    """Steps awaited in tasks of their own (a TaskGroup's): each raises its suspension."""
    async with asyncio.TaskGroup() as tg:
        a = tg.create_task(_awaited(run.step(add, n, 1)))
        b = tg.create_task(_awaited(run.step(mul, n, 2)))
    return [a.result(), b.result()]


@app.durable(name="d:held-then-step", queue=QUEUE)
async def held_then_step(run: Run) -> int:
    """Held in a local call, then waits for a step: cancelled while held (the stop not
    reaching it), its suspension must not park it again."""
    await run.call(held)
    return await run.step(add, 1, 2)


@app.durable(name="d:gate-inline", queue=QUEUE)
async def gate_inline(run: Run, n: int) -> int:
    """Awaits :func:`gated`, a step of its own queue: it runs inline, in the run's slot."""
    return await run.step(gated, n)


@app.durable(name="d:brief", queue=QUEUE, timeout=timedelta(seconds=1))
async def brief(run: Run) -> int:
    """An attempt of 1 s at most, awaiting an inline step that takes longer."""
    return await run.step(slow, 7, 1500)


@app.durable(name="d:brief-deadline", queue=QUEUE, timeout=timedelta(seconds=1))
async def brief_deadline(run: Run) -> list[float]:
    """:func:`brief`, returning what its task's deadline says before and after the step,
    and when the step ended (unix seconds)."""
    before = current_task().deadline
    await run.step(slow, 7, 1500)
    after = current_task().deadline
    assert before is not None and after is not None
    return [before.timestamp(), after.timestamp(), time.time()]
