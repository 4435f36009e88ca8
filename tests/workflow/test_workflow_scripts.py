"""The workflow scripts at their edges, driven through the broker without a worker.

workflow_start, workflow_advance (through workflow_done and ack_many), workflow_cancel:
what each writes, exactly, for the states and sizes its callers can produce. No test
here waits: each runs the scripts and reads Redis.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import (
    Client,
    Inspector,
    Step,
    StepFailure,
    Task,
    WorkflowExistsError,
    chain,
    chord,
    group,
    group_results,
)
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker._base import ARCHIVED_EXPIRATION, STATS_TTL
from asyncq._broker.workflow import (
    AckMode,
    ack_step,
    member_gone,
    read_workflow,
    workflow_key,
)
from asyncq._codec import decode_task_message
from asyncq.errors import TaskNotFoundError
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.helpers import FakeClock, dump_all, expiretime, pexpiretime

Q = "default"
WEEK_MS = 7 * 24 * 3600 * 1000


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


async def take(broker: Broker, qname: str = Q) -> TaskMessage:
    got = await transitions.dequeue(broker, [qname])
    assert got is not None
    return got.message


async def finish(broker: Broker, msg: TaskMessage, result: bytes | None = None) -> str:
    if result is not None:
        await broker.write_result(msg.queue, msg.id, result)
    return await ack_step(broker, msg, "done")


def varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


async def test_a_passed_result_keeps_its_length_at_the_varint_edges(
    redis: Redis, client: Client
) -> None:
    # The next step's payload is appended to its stored message as a second payload
    # field, its length a protobuf varint: one byte below 128, two from 128, three
    # from 16384. Written in the fewest bytes, as protobuf encoders write it.
    broker = Broker(redis)
    for size in (0, 1, 127, 128, 129, 255, 256, 16383, 16384):
        data = bytes(i % 251 for i in range(size))
        await chain(Task("a"), Task("b"), pass_results=True).enqueue(client)
        assert await finish(broker, await take(broker), data) == "running"
        (b_id,) = await redis.lrange(keys.pending_key(Q), 0, -1)
        raw = await redis.hget(keys.task_key(Q, b_id.decode()), "msg")
        assert raw.endswith(b"\x12" + varint(size) + data), size
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


async def server_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return seconds * 1000 + micros // 1000


async def expires_a_week_after(redis: Redis, key: str, t0: int) -> None:
    """*key* expires a week (to the millisecond) after a call made since *t0*."""
    # PEXPIRETIME, or TIME + PTTL on Redis 6.2 (the server matrix), which may read a
    # millisecond early
    at = await pexpiretime(redis, key)
    assert t0 + WEEK_MS - 1 <= at <= await server_ms(redis) + WEEK_MS


@pytest.mark.parametrize("how", ["single", "batch"])
@pytest.mark.parametrize("ttl", [0, 60])
async def test_a_failed_workflow_is_kept_while_members_are_out(
    redis: Redis, client: Client, ttl: int, how: str
) -> None:
    # Policy "fail": the first failure fails the workflow, kept at least a week while
    # its other members are out; the last of them settles it (its retention, or gone),
    # the others acknowledged one by one or in batches.
    broker = Broker(redis)
    info = await chord(
        [Task("m"), Task("m"), Task("m")], Task("cb", retention=timedelta(seconds=ttl))
    ).enqueue(client)
    m = [await take(broker) for _ in range(3)]
    wkey = workflow_key(Q, info.id)

    async def succeed(msg: TaskMessage) -> None:
        if how == "single":
            assert await finish(broker, msg) == "failed"
        else:
            assert await broker.ack_many([(msg, False)]) == [None]

    t0 = await server_ms(redis)
    assert await ack_step(broker, m[0], "archive", "boom") == "failed"
    await expires_a_week_after(redis, wkey, t0)
    assert await redis.hget(wkey, "left:0") == b"2"
    await succeed(m[1])
    await expires_a_week_after(redis, wkey, t0)
    assert await redis.hget(wkey, "left:0") == b"1"
    await succeed(m[2])
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
    await redis.rpush(keys.pending_key(Q), pending)  # a second copy: both go
    wkey = workflow_key(Q, info.id)
    t0 = await server_ms(redis)
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow(Q, info.id) == "running"
        await expires_a_week_after(redis, wkey, t0)  # a member is still out
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


@pytest.mark.parametrize("mode", ["done", "complete", "archive", "revoke"])
async def test_a_step_is_acknowledged_and_counted_by_its_mode(
    redis: Redis, client: Client, broker: Broker, clock: FakeClock, mode: AckMode
) -> None:
    info = await chord(
        [Task("m", retention=timedelta(minutes=1)) for _ in range(2)], Task("cb")
    ).enqueue(client)
    step = await take(broker)
    place = step.headers["asyncq-workflow-step"].replace(".", ":")
    await broker.write_result(Q, step.id, b"r")
    await redis.lpush(keys.active_key(Q), step.id)  # a second copy: leaving active drops both
    now = int(clock.now)
    ok = mode in ("done", "complete")
    assert await ack_step(broker, step, mode, "boom") == ("running" if ok else "failed")
    tkey = keys.task_key(Q, step.id)
    assert await redis.lrange(keys.active_key(Q), 0, -1) == []
    assert await redis.zcard(keys.lease_key(Q)) == 0
    state = {"done": None, "revoke": None, "complete": b"completed", "archive": b"archived"}
    assert await redis.hget(tkey, "state") == state[mode]
    assert await redis.zscore(keys.completed_key(Q), step.id) == (
        now + 60 if mode == "complete" else None
    )
    assert await redis.zscore(keys.archived_key(Q), step.id) == (now if mode == "archive" else None)
    if mode in ("complete", "archive"):
        stored = decode_task_message(await redis.hget(tkey, "msg"))
        assert stored.id == step.id
        if mode == "complete":
            assert stored.completed_at == now
        else:
            assert (stored.error_msg, stored.last_failed_at) == ("boom", now)
    pday, fday = broker._q(Q).daily(clock.now)
    failed = b"1" if mode == "archive" else None
    assert await redis.mget(pday, keys.processed_total_key(Q)) == [b"1", b"1"]
    assert await redis.mget(fday, keys.failed_total_key(Q)) == [failed, failed]
    assert await expiretime(redis, pday) == now + STATS_TTL
    wkey = workflow_key(Q, info.id)
    wf = await redis.hmget(wkey, f"st:{place}", f"r:{place}", f"e:{place}", "left:0", "state")
    if ok:
        assert wf == [b"succeeded", b"r", None, b"1", b"running"]
    else:
        assert wf == [b"failed", None, b"boom", b"1", b"failed"]
    before = await dump_all(redis)
    with pytest.raises(TaskNotFoundError):
        await ack_step(broker, step, mode, "boom")
    assert {k: v[:2] for k, v in (await dump_all(redis)).items()} == {
        k: v[:2] for k, v in before.items()
    }


@pytest.mark.parametrize("fill", ["a", "z"])
async def test_an_archived_step_trims_the_archive_but_never_itself(
    redis: Redis, client: Client, broker: Broker, clock: FakeClock, fill: str
) -> None:
    # 10,000 tasks archived in the same second, their ids sorting before or after the
    # step's ("s"): the size trim takes the lowest of the set but 9,999, the step's
    # neighbours ("a") or the step itself ("z"), which stays all the same.
    now = int(clock.now)
    prefix = keys.task_key_prefix(Q)
    if fill == "z":  # and one past the age limit (without it, "a"'s trim is the size one's)
        await redis.hset(prefix + "old", mapping={"msg": b"m", "state": "archived"})
        await redis.zadd(keys.archived_key(Q), {"old": now - ARCHIVED_EXPIRATION})
    script = """
    for i = 0, 9999 do
        local id = string.format(ARGV[3], i)
        redis.call("HSET", ARGV[1] .. id, "msg", "m", "state", "archived")
        redis.call("ZADD", KEYS[1], ARGV[2], id)
    end
    """
    await redis.eval(script, 1, keys.archived_key(Q), prefix, now, fill + "%05d")  # type: ignore[misc]
    await chain(Step(Task("a"), options={"task_id": "s"}), Task("b")).enqueue(client)
    step = await take(broker)
    assert await ack_step(broker, step, "archive", "boom") == "failed"
    assert await redis.zscore(keys.archived_key(Q), "s") == now
    assert await redis.hget(prefix + "s", "state") == b"archived"
    trimmed = ["a00000", "a00001"] if fill == "a" else ["old", "z00000"]
    assert await redis.zcard(keys.archived_key(Q)) == (9999 if fill == "a" else 10000)
    for gone_id in trimmed:
        assert await redis.exists(prefix + gone_id) == 0
        assert await redis.zscore(keys.archived_key(Q), gone_id) is None
    assert await redis.exists(prefix + fill + "00002") == 1


async def test_an_outcome_already_recorded_is_kept(
    redis: Redis, client: Client, broker: Broker, clock: FakeClock
) -> None:
    # A failed member run again (an archived task run from the Inspector) and a member
    # deleted by hand while its workflow was being canceled (the cancel first, its
    # member_gone after) keep their outcome, one by one or in a batch.
    info = await chord([Task("m"), Task("m")], Task("cb"), on_failure="run").enqueue(client)
    wkey = workflow_key(Q, info.id)
    m0 = await take(broker)
    assert await ack_step(broker, m0, "archive", "boom") == "running"

    async def active_again() -> None:
        tkey = keys.task_key(Q, m0.id)
        await redis.hset(tkey, mapping={"msg": bytes(m0), "state": "active"})
        await redis.lpush(keys.active_key(Q), m0.id)
        await redis.zadd(keys.lease_key(Q), {m0.id: 2**40})

    await active_again()
    assert await ack_step(broker, m0, "done") == "seen"
    await active_again()
    assert await broker.ack_many([(m0, False)]) == [None]
    assert await redis.hmget(wkey, "st:0:0", "e:0:0", "left:0") == [b"failed", b"boom", b"1"]

    q2 = "q2"
    info = await chord([Task("m", queue=q2) for _ in range(2)], Task("cb", queue=q2)).enqueue(
        client
    )
    wkey = workflow_key(q2, info.id)
    out = await take(broker, q2)  # a member still out: the hash stays after the cancel
    j, gone = next((j, s) for j, s in enumerate(info.stages[0]) if s.id != out.id)
    raw = await redis.hget(keys.task_key(q2, gone.id), "msg")
    await redis.delete(keys.task_key(q2, gone.id))
    await redis.lrem(keys.pending_key(q2), 0, gone.id)
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow(q2, info.id) == "running"
    assert await redis.hmget(wkey, f"st:0:{j}", "left:0") == [b"canceled", b"1"]
    assert await member_gone(redis, decode_task_message(raw), "deleted", clock.now) == "seen"
    assert await redis.hmget(wkey, f"st:0:{j}", f"e:0:{j}", "left:0") == [b"canceled", None, b"1"]


@pytest.mark.parametrize("how", ["single", "batch"])
async def test_a_step_whose_workflow_is_gone_is_acknowledged_as_a_plain_task(
    redis: Redis, client: Client, broker: Broker, how: str
) -> None:
    # Its workflow's state expired (or was deleted): the step is acknowledged, and
    # nothing of the workflow is written again.
    info = await chain(Task("a"), Task("b")).enqueue(client)
    step = await take(broker)
    await redis.delete(workflow_key(Q, info.id))
    if how == "single":
        assert await finish(broker, step, b"r") == "gone"
    else:
        await broker.write_result(Q, step.id, b"r")
        assert await broker.ack_many([(step, False)]) == [None]
    assert await redis.exists(workflow_key(Q, info.id), keys.task_key(Q, step.id)) == 0
    assert await redis.llen(keys.active_key(Q)) == 0
    assert await redis.llen(keys.pending_key(Q)) == 0
    assert await redis.get(keys.processed_total_key(Q)) == b"1"


@pytest.mark.parametrize("ttl", [0, 60])
async def test_a_failure_of_the_last_member_out_settles_the_workflow(
    redis: Redis, client: Client, ttl: int
) -> None:
    broker = Broker(redis)
    info = await chord(
        [Task("m"), Task("m")], Task("cb", retention=timedelta(seconds=ttl))
    ).enqueue(client)
    m = [await take(broker) for _ in range(2)]
    wkey = workflow_key(Q, info.id)
    assert await finish(broker, m[0]) == "running"
    assert await ack_step(broker, m[1], "archive", "boom") == "failed"
    assert await redis.llen(keys.pending_key(Q)) == 0
    if ttl:
        assert 0 < await redis.ttl(wkey) <= ttl
        assert await redis.hmget(wkey, "state", "left:0") == [b"failed", b"0"]
    else:
        assert await redis.exists(wkey) == 0


async def test_a_batch_of_steps_already_recorded_changes_nothing(
    redis: Redis, client: Client, broker: Broker
) -> None:
    # A member of a finished stage delivered again (its lease ran out while it was
    # being acknowledged, say): the batch acknowledging it records nothing, and the
    # next stage is not enqueued a second time.
    info = await chain(group(Task("a"), Task("a")), Task("b"), Task("c")).enqueue(client)
    wkey = workflow_key(Q, info.id)
    a = [await take(broker) for _ in range(2)]
    assert await broker.ack_many([(m, False) for m in a]) == [None, None]
    assert await finish(broker, await take(broker)) == "running"  # b: c is enqueued
    c_id = info.stages[2][0].id.encode()
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [c_id]
    before = await redis.hgetall(wkey)
    await redis.hset(keys.task_key(Q, a[0].id), mapping={"msg": bytes(a[0]), "state": "active"})
    await redis.lpush(keys.active_key(Q), a[0].id)
    await redis.zadd(keys.lease_key(Q), {a[0].id: 2**40})
    assert await broker.ack_many([(a[0], False)]) == [None]
    assert await redis.hgetall(wkey) == before
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [c_id]
    assert await redis.exists(keys.task_key(Q, info.stages[1][0].id)) == 0
