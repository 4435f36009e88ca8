"""Workflows in one process: chains, chords, failure policies, cancel, retention, Go workers."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import (
    App,
    Client,
    Inspector,
    ServeMux,
    Server,
    SkipRetry,
    Step,
    StepFailure,
    Task,
    WorkflowNotFoundError,
    chain,
    chord,
    group,
    group_results,
)
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.workflow import ack_step, is_workflow_step, workflow_key
from asyncq.cli import main
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.procs import FAST, wait_until

Q = "default"


class Recorder:
    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.payloads: dict[str, list[bytes]] = {}

    def seen(self, task: Task) -> None:
        self.runs[task.type] += 1
        self.payloads.setdefault(task.type, []).append(task.payload or b"")


async def serve(redis: Redis, mux: ServeMux) -> Server:
    server = Server(redis, concurrency=20, **FAST)
    await server.start(mux)
    return server


async def gone(redis: Redis, key: str) -> bool:
    return await redis.exists(key) == 0


async def field_is(redis: Redis, key: str, name: str, value: bytes) -> bool:
    return await redis.hget(key, name) == value


async def wf_state(redis: Redis, wid: str) -> str | None:
    raw = await redis.hget(workflow_key(Q, wid), "state")
    return raw.decode() if raw else None


async def test_chain_of_three_passes_results_as_payload(redis: Redis, client: Client) -> None:
    rec = Recorder()
    mux = ServeMux()

    async def add(task: Task) -> None:
        rec.seen(task)
        assert task.result_writer is not None
        await task.result_writer.write((task.payload or b"") + task.type.encode())

    for name in ("a", "b", "c"):
        mux.handle(name, add)
    server = await serve(redis, mux)
    try:
        info = await chain(Task("a", b"0"), Task("b"), Task("c"), pass_results=True).enqueue(client)
        await wait_until(lambda: rec.runs["c"] == 1, what="the chain's last step")
        assert rec.payloads == {"a": [b"0"], "b": [b"0a"], "c": [b"0ab"]}
        # retention 0 on the last step: the workflow's state is gone once it finished
        await wait_until(lambda: gone(redis, workflow_key(Q, info.id)), what="state expiry")
    finally:
        await server.shutdown()
    assert rec.runs == Counter(a=1, b=1, c=1)
    assert await redis.keys(keys.task_key_prefix(Q) + "*") == []


async def test_chord_of_100_gets_results_in_group_order(redis: Redis, client: Client) -> None:
    got: list[list[bytes | StepFailure]] = []
    mux = ServeMux()

    async def member(task: Task) -> None:
        await asyncio.sleep(0.001 * (int(task.payload or b"0") % 7))
        assert task.result_writer is not None
        await task.result_writer.write(task.payload or b"")

    async def callback(task: Task) -> None:
        got.append(group_results(task.payload or b""))

    mux.handle("member", member)
    mux.handle("callback", callback)
    server = await serve(redis, mux)
    try:
        wf = chord(
            [Task("member", str(i).encode()) for i in range(100)],
            Step(Task("callback"), options={"retention": timedelta(minutes=1)}),
        )
        info = await wf.enqueue(client)
        await wait_until(lambda: len(got) == 1, within=30, what="the callback")
        async with Inspector(redis) as insp:
            await wait_until(lambda: wf_state(redis, info.id), what="state written")
            seen = await insp.get_workflow(Q, info.id)
        assert seen.state == "succeeded"
        assert [s.state for s in seen.stages[0]] == ["succeeded"] * 100
        assert 0 < await redis.ttl(workflow_key(Q, info.id)) <= 60
    finally:
        await server.shutdown()
    assert got == [[str(i).encode() for i in range(100)]]


@pytest.mark.parametrize("policy", ["fail", "run"])
async def test_failing_member_with_both_policies(redis: Redis, client: Client, policy: str) -> None:
    calls: list[list[bytes | StepFailure]] = []
    mux = ServeMux()

    async def member(task: Task) -> None:
        if task.payload == b"bad":
            raise SkipRetry("no good")
        assert task.result_writer is not None
        await task.result_writer.write(b"ok-" + (task.payload or b""))

    async def callback(task: Task) -> None:
        calls.append(group_results(task.payload or b""))

    mux.handle("member", member)
    mux.handle("callback", callback)
    server = await serve(redis, mux)
    try:
        wf = chord(
            [Task("member", b"1"), Task("member", b"bad"), Task("member", b"3")],
            Step(Task("callback"), options={"retention": timedelta(minutes=1)}),
            on_failure=policy,  # type: ignore[arg-type]
        )
        info = await wf.enqueue(client)
        if policy == "fail":
            await wait_until(lambda: field_is(redis, workflow_key(Q, info.id), "left:0", b"0"))
            async with Inspector(redis) as insp:
                seen = await insp.get_workflow(Q, info.id)
            assert seen.state == "failed"
            assert [s.state for s in seen.stages[0]] == ["succeeded", "failed", "succeeded"]
            assert seen.stages[0][1].error is not None and "no good" in seen.stages[0][1].error
            assert seen.stages[1][0].state == "waiting"
            await asyncio.sleep(0.5)
            assert calls == []
            assert await redis.zcard(keys.archived_key(Q)) == 1
        else:
            await wait_until(lambda: len(calls) == 1, what="the callback")
            assert calls[0][0] == b"ok-1" and calls[0][2] == b"ok-3"
            failure = calls[0][1]
            assert isinstance(failure, StepFailure) and "no good" in failure.error
    finally:
        await server.shutdown()


async def test_cancel_mid_chain_stops_later_steps(redis: Redis, client: Client) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    runs: Counter[str] = Counter()
    mux = ServeMux()

    async def slow(task: Task) -> None:
        runs[task.type] += 1
        started.set()
        await release.wait()

    async def quick(task: Task) -> None:
        runs[task.type] += 1

    mux.handle("first", quick)
    mux.handle("second", slow)
    mux.handle("third", quick)
    server = await serve(redis, mux)
    try:
        info = await chain(
            Task("first"), Task("second"), Task("third", retention=timedelta(minutes=1))
        ).enqueue(client)
        await asyncio.wait_for(started.wait(), 10)
        async with Inspector(redis) as insp:
            assert await insp.cancel_workflow(Q, info.id) == "running"
            assert await insp.cancel_workflow(Q, info.id) == "canceled"
            release.set()
            await wait_until(
                lambda: field_is(redis, workflow_key(Q, info.id), "st:1:0", b"succeeded")
            )
            seen = await insp.get_workflow(Q, info.id)
            assert seen.state == "canceled"
            assert seen.stages[2][0].state == "waiting"
            with pytest.raises(WorkflowNotFoundError):
                await insp.get_workflow(Q, "nope")
        await asyncio.sleep(0.5)
    finally:
        await server.shutdown()
    assert runs == Counter(first=1, second=1)
    assert await redis.keys(keys.task_key_prefix(Q) + "*") == []


async def test_cancel_deletes_pending_group_members(redis: Redis, client: Client) -> None:
    info = await chord([Task("m") for _ in range(5)], Task("cb")).enqueue(client)
    assert await redis.llen(keys.pending_key(Q)) == 5
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow(Q, info.id) == "running"
    assert await redis.llen(keys.pending_key(Q)) == 0
    assert await redis.keys(keys.task_key_prefix(Q) + "*") == []
    assert await redis.exists(workflow_key(Q, info.id)) == 0  # retention 0: gone at once


async def test_result_arg_splices_the_result_into_a_json_object(
    redis: Redis, client: Client
) -> None:
    seen: list[object] = []
    mux = ServeMux()

    async def produce(task: Task) -> None:
        assert task.result_writer is not None
        await task.result_writer.write(json.dumps({"n": int(task.payload or b"0")}).encode())

    async def consume(task: Task) -> None:
        seen.append(json.loads(task.payload or b""))

    mux.handle("produce", produce)
    mux.handle("consume", consume)
    server = await serve(redis, mux)
    try:
        await chain(
            group(Task("produce", b"1"), Task("produce", b"2")),
            Step(Task("consume", b'{"label":"x"}'), result_arg="items"),
            pass_results=True,
        ).enqueue(client)
        await chain(
            Task("produce", b"7"),
            Step(Task("consume"), result_arg="item"),
            pass_results=True,
        ).enqueue(client)
        await wait_until(lambda: len(seen) == 2, what="both consumers")
    finally:
        await server.shutdown()
    assert {"items": [{"n": 1}, {"n": 2}], "label": "x"} in seen
    assert {"item": {"n": 7}} in seen


async def test_a_plain_acknowledgement_leaves_the_workflow_intact(
    redis: Redis, client: Client
) -> None:
    """What a Go asynq worker does: it runs the step and acks it as a plain task."""
    broker = Broker(redis)
    info = await chain(Task("a"), Task("b")).enqueue(client)
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    await broker.done(got.message)
    assert await redis.llen(keys.pending_key(Q)) == 0  # no hand-off
    async with Inspector(redis) as insp:
        seen = await insp.get_workflow(Q, info.id)
    assert seen.state == "running" and seen.stages[0][0].state == "pending"
    assert [s.state for s in seen.stages[1]] == ["waiting"]
    async with Inspector(redis) as insp:
        await insp.cancel_workflow(Q, info.id)  # the operator's way out
    assert await redis.exists(workflow_key(Q, info.id)) == 0


async def test_bad_workflows_are_refused(client: Client) -> None:
    with pytest.raises(ValueError, match="unique"):
        chain(Step(Task("a"), options={"unique": timedelta(minutes=1)}))
    with pytest.raises(ValueError, match="has a payload"):
        await chain(Task("a"), Task("b", b"x"), pass_results=True).enqueue(client)
    with pytest.raises(ValueError, match="JSON object"):
        await chain(Task("a"), Step(Task("b", b"[1]"), result_arg="x"), pass_results=True).enqueue(
            client
        )
    with pytest.raises(ValueError, match="on_failure"):
        chain(Task("a"), on_failure="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        chain()
    with pytest.raises(ValueError, match="twice"):
        await chain(
            Step(Task("a"), options={"task_id": "x"}), Step(Task("b"), options={"task_id": "x"})
        ).enqueue(client)


def test_group_results_refuses_garbage() -> None:
    assert group_results(b"R1:aE2:no") == [b"a", StepFailure("no")]
    assert group_results(b"") == []
    with pytest.raises(ValueError, match="not a workflow"):
        group_results(b"xyz")
    with pytest.raises(ValueError, match="truncated"):
        group_results(b"R9:a")


async def test_cli_inspect_and_cancel(
    redis: Redis, client: Client, redis_url: str, tmp_path: Path
) -> None:
    info = await chord([Task("m"), Task("m")], Task("cb", retention=timedelta(hours=1))).enqueue(
        client, workflow_id="wf-cli"
    )
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def cli(*args: str) -> Result:
        return runner.invoke(main, ["-u", redis_url, "workflow", *args])

    shown = await asyncio.to_thread(cli, "inspect", "-q", Q, "-i", info.id)
    assert shown.exit_code == 0, shown.output
    assert "State:      running" in shown.output and shown.output.count("pending ") == 2
    done = await asyncio.to_thread(cli, "cancel", "-q", Q, "-i", info.id)
    assert done.exit_code == 0 and "canceled" in done.output
    again = await asyncio.to_thread(cli, "cancel", "-q", Q, "-i", info.id)
    assert "already canceled" in again.output
    raw = await asyncio.to_thread(cli, "inspect", "-q", Q, "-i", info.id, "--json")
    data = json.loads(raw.output)
    assert data["state"] == "canceled"
    assert [s["state"] for s in data["stages"][0]] == ["canceled", "canceled"]
    missing = await asyncio.to_thread(cli, "inspect", "-q", Q, "-i", "nope")
    assert missing.exit_code != 0
    assert "workflow not found" in missing.output


async def test_typed_tasks_take_the_previous_result_as_an_argument(
    redis: Redis, client: Client
) -> None:
    app = App(redis)
    shown: list[str] = []

    @app.task(name="wf:double")
    async def double(x: int) -> int:
        return 2 * x

    @app.task(name="wf:total")
    async def total(values: list[int] | None = None, label: str = "") -> int:
        return sum(values or [])

    @app.task(name="wf:show")
    async def show(value: int = 0, label: str = "") -> None:
        shown.append(f"{label}={value}")

    server = app.server(concurrency=10, **FAST)
    await server.start(app.mux)
    try:
        await chain(
            group(double.to_task(1), double.to_task(2), double.to_task(3)),
            Step(total.to_task(label="t"), result_arg="values"),
            Step(show.to_task(label="sum"), result_arg="value"),
            pass_results=True,
        ).enqueue(client)
        await wait_until(lambda: len(shown) == 1, what="the last typed step")
    finally:
        await server.shutdown()
    assert shown == ["sum=12"]


@pytest.mark.parametrize("how", ["delete", "archive"])
@pytest.mark.parametrize("policy", ["fail", "run"])
async def test_a_member_deleted_or_archived_by_hand_fails(
    redis: Redis, client: Client, how: str, policy: str
) -> None:
    info = await chord(
        [Task("m"), Task("m")],
        Task("cb", retention=timedelta(minutes=1)),
        on_failure=policy,  # type: ignore[arg-type]
    ).enqueue(client)
    broker = Broker(redis)
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    first = got.message
    other = next(s.id for s in info.stages[0] if s.id != first.id)
    async with Inspector(redis) as insp:
        await (insp.delete_task(Q, other) if how == "delete" else insp.archive_task(Q, other))
        seen = await insp.get_workflow(Q, info.id)
        assert {s.id: s.state for s in seen.stages[0]}[other] == "failed"
        assert seen.state == ("failed" if policy == "fail" else "running")
        await ack_step(broker, first, "done")  # the other member finishes normally
        if policy == "fail":
            seen = await insp.get_workflow(Q, info.id)
            assert seen.state == "failed" and seen.stages[1][0].state == "waiting"
            assert await redis.llen(keys.pending_key(Q)) == 0
        else:
            assert await redis.llen(keys.pending_key(Q)) == 1  # the callback, with the failure
            cb = await transitions.dequeue(broker, [Q])
            assert cb is not None and cb.message.type == "cb"
            results = group_results(cb.message.payload)
            assert isinstance(results[[s.id for s in info.stages[0]].index(other)], StepFailure)


async def test_recoverer_archiving_a_lost_step_fails_the_workflow(
    redis: Redis, client: Client
) -> None:
    info = await chain(
        Step(Task("a"), options={"max_retry": 0}), Task("b", retention=timedelta(minutes=1))
    ).enqueue(client)
    broker = Broker(redis)
    got = await transitions.dequeue(broker, [Q])  # a worker takes it, then dies
    assert got is not None
    await redis.zadd(keys.lease_key(Q), {got.message.id: 1})  # its lease long expired
    server = await serve(redis, ServeMux())
    try:
        await wait_until(
            lambda: field_is(redis, workflow_key(Q, info.id), "state", b"failed"),
            what="the recoverer's archive to reach the workflow",
        )
    finally:
        await server.shutdown()
    async with Inspector(redis) as insp:
        seen = await insp.get_workflow(Q, info.id)
    assert seen.stages[0][0].state == "failed" and seen.stages[1][0].state == "waiting"
    assert await redis.zcard(keys.archived_key(Q)) == 1


def test_malformed_workflow_headers_make_a_plain_task() -> None:
    good = {"asyncq-workflow": "w", "asyncq-workflow-queue": "q", "asyncq-workflow-step": "1.2"}
    assert is_workflow_step(TaskMessage(type="t", headers=good))
    for key, value in [
        ("asyncq-workflow-step", "x"),
        ("asyncq-workflow-step", "1"),
        ("asyncq-workflow-queue", ""),
        ("asyncq-workflow", ""),
    ]:
        assert not is_workflow_step(TaskMessage(type="t", headers={**good, key: value}))
    assert not is_workflow_step(TaskMessage(type="t", headers={"asyncq-workflow": "w"}))


@given(
    results=st.lists(
        st.one_of(st.binary(max_size=40), st.text(max_size=20).map(lambda t: f"E{t}")),
        min_size=1,
        max_size=8,
    )
)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
async def test_any_results_reach_the_callback_in_group_order(
    redis: Redis, client: Client, results: list[bytes | str]
) -> None:
    """Members finish in any order with any bytes (or fail, as str); the callback sees them all."""
    await redis.flushdb()
    broker = Broker(redis)
    info = await chord(
        [Task("m", str(i).encode()) for i in range(len(results))],
        Task("cb"),
        on_failure="run",
    ).enqueue(client)
    members = [s.id for s in info.stages[0]]
    got = [await transitions.dequeue(broker, [Q]) for _ in results]
    for d in reversed(got):  # finish in another order than the group's
        assert d is not None
        want = results[members.index(d.message.id)]
        if isinstance(want, str):
            await ack_step(broker, d.message, "archive", want)
        else:
            await broker.write_result(Q, d.message.id, want)
            await ack_step(broker, d.message, "done")
    cb = await transitions.dequeue(broker, [Q])
    assert cb is not None and cb.message.type == "cb"
    expected = [StepFailure(w) if isinstance(w, str) else w for w in results]
    assert group_results(cb.message.payload) == expected
