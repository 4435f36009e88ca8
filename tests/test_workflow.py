"""Workflows in one process: chains, chords, failure policies, cancel, retention, Go workers."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

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
    WorkflowExistsError,
    WorkflowNotFoundError,
    chain,
    chord,
    group,
    group_results,
)
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.workflow import ack_step, is_workflow_step, read_workflow, workflow_key
from asyncq.cli import main
from asyncq.proto.asynq import TaskMessage
from tests import transitions
from tests.workers.support import FAST, wait_until

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


async def dump_all(redis: Redis) -> dict[bytes, tuple[bytes, Any, int]]:
    """Every key: its type, DUMP bytes and expiry."""
    return {
        key: (await redis.type(key), await redis.dump(key), await redis.pttl(key))
        for key in sorted(await redis.keys("*"))
    }


async def test_a_taken_workflow_id_starts_nothing(redis: Redis, client: Client) -> None:
    first = await chain(Task("a"), Task("b")).enqueue(client, workflow_id="w1")
    before = await dump_all(redis)
    with pytest.raises(WorkflowExistsError, match="workflow exists"):
        await chord([Task("x"), Task("y")], Task("z")).enqueue(client, workflow_id="w1")
    assert await dump_all(redis) == before
    wf = await read_workflow(redis, Q, "w1")
    assert wf is not None and [s.id for s in wf.stages[0]] == [first.stages[0][0].id]


@pytest.mark.parametrize("taken", [0, 1, 2])
async def test_a_taken_first_stage_task_id_starts_nothing(
    redis: Redis, client: Client, taken: int
) -> None:
    # Every member of the first stage is checked, whichever place the taken id has.
    await client.enqueue(Task("plain", task_id=f"t{taken}"))
    before = await dump_all(redis)
    members = [Step(Task("m"), options={"task_id": f"t{j}"}) for j in range(3)]
    with pytest.raises(WorkflowExistsError, match=f"task exists t{taken}"):
        await chord(members, Task("cb")).enqueue(client, workflow_id="w1")
    assert await dump_all(redis) == before


@pytest.mark.parametrize("n", [98, 99, 198, 199])
async def test_a_large_later_stage_is_written_whole(redis: Redis, client: Client, n: int) -> None:
    # The hash's fields go to HSET in slices of 1000 arguments: 10 + 5n fields here,
    # so these sizes fill one or two slices exactly, or spill one pair over.
    info = await chain(Task("a"), group(*[Task("m") for _ in range(n)])).enqueue(client)
    fields = 10 + 5 * n + 4  # and the first stage's member: id, q, t, st
    assert await redis.hlen(workflow_key(Q, info.id)) == fields
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.stages == info.stages
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [info.stages[0][0].id.encode()]


@pytest.mark.parametrize("n", [125, 126, 1000, 1001])
async def test_a_large_first_stage_is_written_and_pushed_whole(
    redis: Redis, client: Client, n: int
) -> None:
    # The first stage's fields (8 per member) and ids go out in slices of 1000:
    # these sizes fill one slice exactly or spill over, for each.
    info = await chord([Task("m") for _ in range(n)], Task("cb")).enqueue(client)
    ids = [s.id for s in info.stages[0]]
    # pushed in member order: the list's head is the last member
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [i.encode() for i in reversed(ids)]
    assert await redis.hlen(workflow_key(Q, info.id)) == 10 + 5 + 4 * n + 1  # and pass:1
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.stages == info.stages
    for tid in (ids[0], ids[-1]):
        assert await redis.hget(keys.task_key(Q, tid), "state") == b"pending"


# -- the workflow scripts at their edges (driven through the broker, no worker) ---------


async def take(broker: Broker, qname: str = Q) -> TaskMessage:
    got = await transitions.dequeue(broker, [qname])
    assert got is not None
    return got.message


async def finish(broker: Broker, msg: TaskMessage, result: bytes | None = None) -> str:
    if result is not None:
        await broker.write_result(msg.queue, msg.id, result)
    return await ack_step(broker, msg, "done")


async def test_a_passed_result_keeps_its_length_at_the_varint_edges(
    redis: Redis, client: Client
) -> None:
    # The next step's payload is appended to its stored message as a second payload
    # field, its length a protobuf varint: one byte below 128, two from 128, three
    # from 16384.
    broker = Broker(redis)
    for size in (0, 1, 127, 128, 129, 255, 256, 16383, 16384):
        data = bytes(i % 251 for i in range(size))
        await chain(Task("a"), Task("b"), pass_results=True).enqueue(client)
        assert await finish(broker, await take(broker), data) == "running"
        b = await take(broker)
        assert (b.type, b.payload) == ("b", data), size
        assert await finish(broker, b) == "succeeded"


async def test_a_group_of_one_passes_a_list(redis: Redis, client: Client) -> None:
    # After a group (even of one member) the next step gets the list form; after a
    # single step, the result itself.
    broker = Broker(redis)
    await chain(group(Task("a")), Task("b"), pass_results=True).enqueue(client)
    await finish(broker, await take(broker), b"abc")
    assert (await take(broker)).payload == b"R3:abc"
    await chain(
        group(Task("a")), Step(Task("b", b'{"k":1}'), result_arg="x"), pass_results=True
    ).enqueue(client)
    await finish(broker, await take(broker), b'"abc"')
    assert json.loads((await take(broker)).payload) == {"x": ["abc"], "k": 1}
    await chain(Task("a"), Step(Task("b"), result_arg="x"), pass_results=True).enqueue(client)
    await finish(broker, await take(broker), b"[7]")
    assert json.loads((await take(broker)).payload) == {"x": [7]}


async def test_failed_and_empty_results_pass_as_null_or_as_failures(
    redis: Redis, client: Client
) -> None:
    # Policy "run": a failed member's error reaches the next step; a member that wrote
    # no result (or an empty one) passes b"" (R0:) or null.
    broker = Broker(redis)
    for as_json in (False, True):
        nxt = Step(Task("b"), result_arg="x") if as_json else Task("b")
        await chain(
            group(Task("a"), Task("a"), Task("a"), Task("a")),
            nxt,
            pass_results=True,
            on_failure="run",
        ).enqueue(client)
        members = [await take(broker) for _ in range(4)]
        by_place = {m.headers["asyncq-workflow-step"]: m for m in members}
        await finish(broker, by_place["0.0"], b"1")
        await finish(broker, by_place["0.1"])
        await finish(broker, by_place["0.2"], b"")
        assert await ack_step(broker, by_place["0.3"], "archive", "boom") == "running"
        b = await take(broker)
        if as_json:
            assert json.loads(b.payload) == {"x": [1, None, None, None]}
        else:
            assert group_results(b.payload) == [b"1", b"", b"", StepFailure("boom")]
        await finish(broker, b)


async def test_a_next_step_whose_id_is_taken_leaves_that_task_alone(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    info = await chain(Task("a"), Step(Task("b"), options={"task_id": "x"})).enqueue(client)
    a = await take(broker)
    plain = await client.enqueue(Task("plain", b"p", task_id="x"))
    before = await redis.hgetall(keys.task_key(Q, plain.id))
    assert await finish(broker, a) == "running"
    assert await redis.hgetall(keys.task_key(Q, plain.id)) == before
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"x"]
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and (wf.stage, wf.stages[1][0].state) == (1, "pending")


async def test_a_next_stage_over_two_queues_is_pushed_to_each(redis: Redis, client: Client) -> None:
    broker = Broker(redis)
    info = await chain(
        Task("a"), group(Task("m", queue="q1"), Task("m", queue="q2"), Task("m", queue="q1"))
    ).enqueue(client)
    await finish(broker, await take(broker))
    ids = [s.id.encode() for s in info.stages[1]]
    assert await redis.lrange(keys.pending_key("q1"), 0, -1) == [ids[2], ids[0]]
    assert await redis.lrange(keys.pending_key("q2"), 0, -1) == [ids[1]]
    for s in info.stages[1]:
        assert await redis.hget(keys.task_key(s.queue, s.id), "state") == b"pending"


@pytest.mark.parametrize("n", [500, 501, 1000, 1001])
async def test_a_large_next_stage_is_enqueued_whole(redis: Redis, client: Client, n: int) -> None:
    # Its marks (2 per member), the stored messages it drops and its ids go out in
    # slices of 1000 arguments: these sizes fill a slice exactly or spill over.
    broker = Broker(redis)
    info = await chain(Task("a"), group(*[Task("m") for _ in range(n)])).enqueue(client)
    await finish(broker, await take(broker))
    ids = [s.id.encode() for s in info.stages[1]]
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == ids[::-1]
    wkey = workflow_key(Q, info.id)
    fields = await redis.hkeys(wkey)
    assert not [f for f in fields if f.startswith(b"m:")]
    assert len(fields) == 10 + 4 * n + 4
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.stage == 1
    assert [s.state for s in wf.stages[1]] == ["pending"] * n


@pytest.mark.parametrize("n", [500, 501, 1001])
async def test_a_large_chord_passes_every_result_in_order(
    redis: Redis, client: Client, n: int
) -> None:
    # One batch acknowledges every member: their states are read, and then their
    # results, in slices of 1000 fields.
    broker = Broker(redis)
    info = await chord([Task("m") for _ in range(n)], Task("cb")).enqueue(client)
    got = await transitions.dequeue_many(broker, [Q], n)
    assert len(got) == n
    pipe = redis.pipeline(transaction=False)
    for d in got:
        place = d.message.headers["asyncq-workflow-step"]
        pipe.hset(keys.task_key(Q, d.message.id), "result", place.encode())
    await pipe.execute()
    assert await broker.ack_many([(d.message, False) for d in got]) == [None] * n
    cb = await take(broker)
    assert group_results(cb.payload) == [f"0.{j}".encode() for j in range(n)]
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.stage == 1
    assert await redis.hget(workflow_key(Q, info.id), "left:0") == b"0"


@pytest.mark.parametrize("ttl", [0, 60])
async def test_a_failed_workflow_is_kept_while_members_are_out(
    redis: Redis, client: Client, ttl: int
) -> None:
    # Policy "fail": the first failure fails the workflow, kept at least a week while
    # its other members are out; the last of them settles it (its retention, or gone).
    broker = Broker(redis)
    info = await chord(
        [Task("m"), Task("m"), Task("m")], Task("cb", retention=timedelta(seconds=ttl))
    ).enqueue(client)
    m = [await take(broker) for _ in range(3)]
    wkey = workflow_key(Q, info.id)
    assert await ack_step(broker, m[0], "archive", "boom") == "failed"
    assert 604800 - 60 < await redis.ttl(wkey) <= 604800
    assert await redis.hget(wkey, "left:0") == b"2"
    assert await finish(broker, m[1]) == "failed"
    assert 604800 - 60 < await redis.ttl(wkey) <= 604800
    assert await finish(broker, m[2]) == "failed"
    assert await redis.llen(keys.pending_key(Q)) == 0
    if ttl:
        assert 0 < await redis.ttl(wkey) <= ttl
        wf = await read_workflow(redis, Q, info.id)
        assert wf is not None and wf.state == "failed"
        assert [s.state for s in wf.stages[0]] == ["failed", "succeeded", "succeeded"]
    else:
        assert await redis.exists(wkey) == 0


async def test_a_step_acknowledged_twice_counts_once(redis: Redis, client: Client) -> None:
    broker = Broker(redis)
    info = await chord([Task("m"), Task("m")], Task("cb")).enqueue(client)
    m = [await take(broker) for _ in range(2)]
    assert await finish(broker, m[0], b"r") == "running"
    # the same step again (a duplicate delivery): its task is back, its place recorded
    await redis.hset(keys.task_key(Q, m[0].id), mapping={"msg": bytes(m[0]), "state": "active"})
    await redis.lpush(keys.active_key(Q), m[0].id)
    await redis.zadd(keys.lease_key(Q), {m[0].id: 2**40})
    assert await ack_step(broker, m[0], "archive", "late") == "seen"
    wkey = workflow_key(Q, info.id)
    assert await redis.hget(wkey, "left:0") == b"1"
    assert await redis.hget(wkey, "st:0:0") == b"succeeded"
    assert await redis.hget(wkey, "e:0:0") is None
    assert await finish(broker, m[1]) == "running"
    assert await redis.hget(wkey, "stage") == b"1"


@pytest.mark.parametrize("ttl", [0, 60])
async def test_cancel_resolves_each_member_by_its_task_state(
    redis: Redis, client: Client, ttl: int
) -> None:
    # The current stage's members: pending, scheduled and retry tasks are deleted; a
    # task gone counts as canceled too; one a plain asynq worker completed or archived
    # (no hand-off) counts as succeeded or failed and is kept; an active one stays out.
    broker = Broker(redis)
    info = await chord(
        [Task("m") for _ in range(7)], Task("cb", retention=timedelta(seconds=ttl))
    ).enqueue(client)
    ids = [s.id for s in info.stages[0]]
    active = await take(broker)
    ids.remove(active.id)
    pending, scheduled, retry, gone_id, completed, archived = ids
    tkey = lambda tid: keys.task_key(Q, tid)  # noqa: E731
    for tid in (scheduled, retry, gone_id, completed, archived):
        await redis.lrem(keys.pending_key(Q), 0, tid)
    for tid, zkey, state in (
        (scheduled, keys.scheduled_key(Q), "scheduled"),
        (retry, keys.retry_key(Q), "retry"),
        (completed, keys.completed_key(Q), "completed"),
        (archived, keys.archived_key(Q), "archived"),
    ):
        await redis.zadd(zkey, {tid: 2**40})
        await redis.hset(tkey(tid), "state", state)
    await redis.delete(tkey(gone_id))
    wkey = workflow_key(Q, info.id)
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow(Q, info.id) == "running"
        before = {k: v[:2] for k, v in (await dump_all(redis)).items()}
        assert await insp.cancel_workflow(Q, info.id) == "canceled"  # and changes nothing
        assert {k: v[:2] for k, v in (await dump_all(redis)).items()} == before
    assert await redis.llen(keys.pending_key(Q)) == 0
    assert await redis.zcard(keys.scheduled_key(Q)) == 0
    assert await redis.zcard(keys.retry_key(Q)) == 0
    for tid in (pending, scheduled, retry):
        assert await redis.exists(tkey(tid)) == 0
    assert await redis.hget(tkey(completed), "state") == b"completed"
    assert await redis.hget(tkey(archived), "state") == b"archived"
    assert await redis.hget(tkey(active.id), "state") == b"active"
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.state == "canceled" and wf.finished is not None
    states = {s.id: s.state for s in wf.stages[0]}
    assert states == {
        active.id: "pending",
        pending: "canceled",
        scheduled: "canceled",
        retry: "canceled",
        gone_id: "canceled",
        completed: "succeeded",
        archived: "failed",
    }
    assert await redis.hget(wkey, "left:0") == b"1"
    assert 604800 - 60 < await redis.ttl(wkey) <= 604800  # a member is still out
    assert await finish(broker, active) == "canceled"
    assert await redis.llen(keys.pending_key(Q)) == 0  # no hand-off
    if ttl:
        assert 0 < await redis.ttl(wkey) <= ttl
        assert await redis.hget(wkey, "left:0") == b"0"
    else:
        assert await redis.exists(wkey) == 0


@pytest.mark.parametrize("ttl", [0, 60])
async def test_cancel_with_no_member_out_settles_at_once(
    redis: Redis, client: Client, ttl: int
) -> None:
    info = await chain(
        Task("a"), group(Task("b"), Task("b")), Task("c", retention=timedelta(seconds=ttl))
    ).enqueue(client)
    broker = Broker(redis)
    await finish(broker, await take(broker))  # the cancel finds stage 1
    wkey = workflow_key(Q, info.id)
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow(Q, info.id) == "running"
    assert await redis.llen(keys.pending_key(Q)) == 0
    if ttl:
        assert 0 < await redis.ttl(wkey) <= ttl
        wf = await read_workflow(redis, Q, info.id)
        assert wf is not None and [s.state for s in wf.stages[1]] == ["canceled"] * 2
        assert wf.stages[0][0].state == "succeeded" and wf.stages[2][0].state == "waiting"
        assert await redis.hget(wkey, "left:1") == b"0"
    else:
        assert await redis.exists(wkey) == 0
    assert await redis.keys(keys.task_key_prefix(Q) + "*") == []
