"""Workflow handles: typed final results, per-step status, build-time checks of result passing,
handles on tasks that do not exist yet."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Server, Step, Task, TaskNotFoundError, chain, chord
from asyncq import _keys as keys
from asyncq._producer.workflow import WorkflowFailedError, typed_group
from tests.support import wf_app as wf
from tests.support.procs import ROOT, stop_process


async def test_typed_pipe_result_and_status(redis: Redis, worker: Server) -> None:
    handle = await wf.incr.s(1).then(wf.scale, factor=10).then(wf.incr).enqueue()
    assert await handle.result(timeout=20) == 21
    status = await handle.status()
    assert status.state == "succeeded"
    assert [[(s.type, s.state) for s in stage] for stage in status.stages] == [
        [("wf:incr", "succeeded")],
        [("wf:scale", "succeeded")],
        [("wf:incr", "succeeded")],
    ]
    assert handle.id == status.id and handle.stages[1][0].id == status.stages[1][0].id


async def test_untyped_chain_gives_the_raw_bytes(redis: Redis, worker: Server) -> None:
    handle = await chain(
        wf.incr.to_task(1), Step(wf.incr.to_task(0), result_arg="n"), pass_results=True
    ).enqueue()
    assert await handle.result(timeout=20) == 3  # the last step is typed: decoded
    # A plain Task: its result bytes (it needs a retention, or the state goes with it).
    plain = Task("wf:incr", b'{"n":4}', retention=timedelta(minutes=1))
    handle = await chain(plain).enqueue(wf.app.client)
    assert await handle.result(timeout=20) == b"5"


async def test_failure_raises_with_the_step_errors(redis: Redis, worker: Server) -> None:
    handle = await wf.fail.s(3).then(wf.incr).enqueue()
    with pytest.raises(WorkflowFailedError, match="refused 3") as err:
        await handle.result(timeout=20)
    assert err.value.info.state == "failed"
    assert list(err.value.failures) == [handle.stages[0][0].id]


async def test_result_times_out(redis: Redis, app: None) -> None:
    handle = await wf.incr.s(1).then(wf.incr).enqueue()  # no worker
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.3s"):
        await handle.result(timeout=0.3)


def test_result_arg_typos_and_type_mismatches_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match=r"result_arg 'prics'.*did you mean 'prices'"):
        chord(
            [wf.incr.to_task(1), wf.incr.to_task(2)],
            Step(wf.add_up.to_task([]), result_arg="prics"),
        )
    with pytest.raises(TypeError, match=r"argument 'text' takes str, but the stage before"):
        chain(wf.incr.to_task(1), Step(wf.label.to_task(""), result_arg="text"), pass_results=True)
    with pytest.raises(TypeError, match=r"'prices' takes list\[int\].*list\[str\]"):
        chord(
            [wf.label.to_task("a"), wf.label.to_task("b")],
            Step(wf.add_up.to_task([]), result_arg="prices"),
        )
    with pytest.raises(TypeError, match="'text' takes str"):
        wf.incr.s(1).then(wf.label)  # type: ignore[arg-type]
    from asyncq._producer.workflow import _compatible

    assert _compatible(int | None, int | None) and not _compatible(int | None, int)
    assert _compatible(bool, int) and _compatible(int, float) and not _compatible(str, bytes)
    assert _compatible(list[bool], list[int]) and not _compatible(list[str], list[int])
    # Compatible: int into int, a group of ints into list[int].
    chord([wf.incr.to_task(1)], Step(wf.add_up.to_task([]), result_arg="prices"))
    typed_group(wf.incr.s(1), wf.incr.s(2)).then(wf.add_up, discount=1)


def _worker_process(redis_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "worker", "tests.support.wf_app:app", "-c", "4"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.subprocess
@pytest.mark.timeout(120)
async def test_chord_result_awaited_across_processes_before_the_callback_exists(
    redis_url: str, redis: Redis, app: None
) -> None:
    proc = _worker_process(redis_url)
    try:
        handle = (
            await typed_group(wf.price.s(1), wf.price.s(2), wf.price.s(3))
            .then(wf.add_up, discount=5)
            .enqueue()
        )
        callback = handle.stages[-1][0]
        waiter = asyncio.create_task(wf.add_up.handle_of(callback.id).result(timeout=60))
        whole = asyncio.create_task(handle.result(timeout=60))
        await asyncio.sleep(0.3)  # both are waiting now
        assert not waiter.done() and not whole.done()
        # The callback does not exist yet: its members wait for GO.
        assert await redis.exists(keys.task_key(callback.queue, callback.id)) == 0
        await redis.set(wf.GO, 1)
        assert await waiter == 55
        assert await whole == 55
        status = await handle.status()
        assert [s.state for s in status.stages[0]] == ["succeeded"] * 3
    finally:
        stop_process(proc)


async def test_handle_of_gives_up_at_the_timeout(redis: Redis, app: None) -> None:
    with pytest.raises(TaskNotFoundError):
        await wf.incr.handle_of("never-enqueued").result(timeout=timedelta(milliseconds=300))


async def test_eager_mode_runs_typed_workflows_in_process(redis: Redis, app: None) -> None:
    async with wf.app.eager():
        assert await (await wf.incr.enqueue(1)).result() == 2  # tasks run eagerly
        handle = await wf.incr.s(1).then(wf.scale, factor=10).then(wf.incr).enqueue()
        assert await handle.result() == 21
        status = await handle.status()
        assert status.state == "succeeded"
        assert [s.result for stage in status.stages for s in stage] == [b"2", b"20", b"21"]
        fan = typed_group(wf.incr.s(1), wf.incr.s(2)).then(wf.add_up, discount=1)
        assert await (await fan.enqueue()).result() == 4
        # A failure stops a "fail" workflow: the later steps never run.
        failed = await wf.fail.s(1).then(wf.incr).enqueue()
        with pytest.raises(WorkflowFailedError, match="refused 1") as err:
            await failed.result()
        assert [[s.state for s in stage] for stage in err.value.info.stages] == [
            ["failed"],
            ["waiting"],
        ]
        # "run": the callback runs, the failed member's entry is null.
        mixed = typed_group(wf.incr.s(1), wf.fail.s(2), on_failure="run").then(wf.count_ok)
        assert await (await mixed.enqueue()).result() == 1
        # What eager mode cannot imitate is refused, naming the step.
        with pytest.raises(RuntimeError, match="typed tasks only; step 'plain'"):
            await chain(wf.incr.to_task(1), Task("plain")).enqueue(wf.app.client)
        with pytest.raises(RuntimeError, match=r"handle_of.*not available in eager mode"):
            wf.incr.handle_of("some-id")
    assert await redis.dbsize() == 0  # nothing was written
    # Outside the block the same workflow goes to Redis.
    handle = await wf.incr.s(1).then(wf.incr).enqueue()
    assert (await handle.status()).state == "running"
