"""The producer's hot path writes exactly what the general path (compose) writes.

Client.enqueue and Client.enqueue_many compose a plain option set once and then
only build type, payload, id and headers in front of a cached byte tail; these
tests hold that path against compose + encode_task_message, byte for byte, and
against what lands in Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis as sync_redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker.producer import MANY_CHUNK
from asyncq._codec import decode_task_message, encode_task_message
from asyncq._producer.client import Client
from asyncq._producer.compose import Templates, compose, info_of
from asyncq._redis.connection import Connection
from asyncq.errors import TaskIdConflictError
from asyncq.task import Task, TaskInfo

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _leave_nothing_behind(redis_url: str) -> Iterator[None]:
    """These tests leave thousands of pending tasks; a later worker test must not meet them."""
    yield
    client = sync_redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
    finally:
        client.close()


queues = st.text(alphabet="abcxyz:-_0123456789", min_size=1, max_size=12)
texts = st.text(max_size=20)
plain_options = st.fixed_dictionaries(
    {},
    optional={
        "queue": st.one_of(st.none(), queues),
        "max_retry": st.one_of(st.none(), st.integers(0, 2**31 - 1)),
        "timeout": st.one_of(
            st.none(),
            st.just(timedelta(0)),
            st.integers(1, 10**9).map(lambda s: timedelta(seconds=s)),
        ),
        "retention": st.one_of(
            st.none(), st.integers(0, 10**9).map(lambda s: timedelta(seconds=s))
        ),
    },
)
tasks = st.builds(
    lambda type_, payload, headers, own: Task(type_, payload, headers=headers, **own),
    st.text(min_size=1, max_size=300).filter(str.strip),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.dictionaries(texts, texts, max_size=3),
    plain_options,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(task=tasks, options=plain_options)
def test_template_bytes_and_info_equal_compose(task: Task, options: dict[str, Any]) -> None:
    templates = Templates()
    key = templates.key(task, templates.call_key(options))
    assert key is not None  # every option here is a plain one
    first = compose(task, [options], NOW)
    templates.learn(key, first)
    template = templates.get(key)
    assert template is not None

    plain = template.encode(task)
    task.options = {**task.options, "task_id": plain.task_id}  # type: ignore[typeddict-item]
    reference = compose(task, [options], NOW)
    msg = reference.message
    assert plain.data == encode_task_message(msg)
    assert decode_task_message(plain.data) == msg
    assert plain.info(NOW) == info_of(reference, NOW)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(task=tasks, task_id=st.text(alphabet="abc-0123456789", min_size=1, max_size=40),
       headers=st.dictionaries(texts, texts, max_size=3))  # fmt: skip
def test_a_template_message_with_its_id_and_headers_equals_compose(
    task: Task, task_id: str, headers: dict[str, str]
) -> None:
    """A durable run's step: composed with its id and headers as the call's options."""
    templates = Templates()
    key = templates.key(task, ())
    assert key is not None
    templates.learn(key, compose(task, [], NOW))
    template = templates.get(key)
    assert template is not None
    message, data = template.message(task, task_id, headers)
    reference = compose(task, [{"task_id": task_id, "headers": headers}], NOW).message
    assert message == reference
    assert data == encode_task_message(reference)


def test_option_sets_that_need_compose_get_no_key() -> None:
    templates = Templates()
    call = templates.call_key({"queue": "q"})
    assert templates.key(Task("t"), call) is not None
    for options in ({"unique": timedelta(seconds=5)}, {"task_id": "x"}, {"group": "g"},
                    {"process_in": timedelta(seconds=1)}, {"deadline": NOW}):  # fmt: skip
        assert templates.call_key(options) is None
        assert templates.key(Task("t", **options), call) is None  # type: ignore[arg-type]
    assert templates.call_key({"headers": {"a": "b"}}) is None  # call headers: compose merges


async def test_a_cached_set_does_not_accept_lookalike_values(redis: Redis) -> None:
    """True == 1 and 1.0 == 1 hash alike; the cache must not let them past compose's checks."""
    async with Client(redis) as client:
        await client.enqueue(Task("t"), max_retry=1)
        await client.enqueue(Task("t"), max_retry=1)  # served from the template
        with pytest.raises(TypeError, match="max_retry must be an int"):
            await client.enqueue(Task("t"), max_retry=True)
        with pytest.raises(TypeError, match="max_retry must be an int"):
            await client.enqueue(Task("t"), max_retry=1.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="typename cannot be empty"):
            task = Task("t")
            task.type = " "
            await client.enqueue(task, max_retry=1)
        for odd in (["t"], b"t"):  # unhashable, and one that equals no str: neither is kept
            task = Task("t")
            task.type = odd  # type: ignore[assignment]
            with pytest.raises(ValueError, match="typename cannot be empty"):
                await client.enqueue(task, max_retry=1)
        with pytest.raises(TypeError, match="header keys and values must be str"):
            await client.enqueue(Task("t", headers={"a": 1}), max_retry=1)  # type: ignore[dict-item]
        assert await redis.llen(keys.pending_key("default")) == 2


@pytest.mark.parametrize("transport", ["fast", "redis-py"])
async def test_hot_path_writes_what_asynq_writes(
    transport: str, redis: Redis, redis_url: str
) -> None:
    target: Redis | str = redis_url if transport == "fast" else redis
    async with Client(target) as client:
        infos = [
            await client.enqueue(Task("email", b"%d" % i, headers={"h": "v"}), queue="mail")
            for i in range(3)
        ]
    for i, info in enumerate(infos):
        stored = await redis.hgetall(keys.task_key("mail", info.id))
        assert set(stored) == {b"msg", b"state", b"pending_since"}
        assert stored[b"state"] == b"pending"
        msg = decode_task_message(stored[b"msg"])
        assert (msg.type, msg.payload, msg.queue, msg.retry, msg.timeout) == (
            "email", b"%d" % i, "mail", 25, 1800
        )  # fmt: skip
        assert msg.headers == {"h": "v"}
        assert info.headers == {"h": "v"} and info.timeout == timedelta(minutes=30)
    assert await redis.lrange(keys.pending_key("mail"), 0, -1) == [
        info.id.encode() for info in reversed(infos)
    ]
    assert await redis.smembers(keys.ALL_QUEUES) == {b"mail"}


async def test_enqueue_many_chunks_and_runs_keep_order_and_results(redis: Redis) -> None:
    n = MANY_CHUNK * 2 + 7
    items: list[Task | tuple[Task, Any]] = [Task("a", b"%d" % i) for i in range(n)]
    items.insert(10, (Task("b", b"scheduled"), {"process_in": timedelta(hours=1)}))
    items.insert(20, (Task("c", b"other"), {"queue": "other"}))
    items.insert(30, (Task("d"), {"max_retry": -1}))
    async with Client(redis) as client:
        results = await client.enqueue_many(items)
    assert len(results) == n + 3
    assert isinstance(results[30], ValueError)
    infos = [r for r in results if isinstance(r, TaskInfo)]
    assert len(infos) == n + 2
    pending = await redis.lrange(keys.pending_key("default"), 0, -1)
    # FIFO: the dequeue end (the list's tail) holds the first item
    expected = [r.id.encode() for r in results if isinstance(r, TaskInfo) and r.queue == "default"
                and r.type == "a"]  # fmt: skip
    assert list(reversed(pending)) == expected
    for info in infos[:5] + infos[-5:]:
        stored = await redis.hget(keys.task_key(info.queue, info.id), "msg")
        assert stored is not None and decode_task_message(stored).id == info.id
    assert await redis.zcard(keys.scheduled_key("default")) == 1
    assert await redis.llen(keys.pending_key("other")) == 1


async def test_enqueue_many_one_call_reports_an_existing_id_per_item(redis: Redis) -> None:
    async with Client(redis) as client:
        first = await client.enqueue(Task("a"), task_id="taken")
        assert first.id == "taken"
        results = await client.enqueue_many(
            [Task("a"), Task("a"), (Task("a"), {"task_id": "taken"}), Task("a")]
        )
    assert isinstance(results[2], TaskIdConflictError)
    assert [isinstance(r, TaskInfo) for r in results] == [True, True, False, True]
    assert await redis.llen(keys.pending_key("default")) == 4


async def test_enqueue_many_wrong_type_pending_writes_nothing(redis: Redis) -> None:
    await redis.set(keys.pending_key("default"), "not a list")
    async with Client(redis) as client:
        await client.enqueue(Task("warm"), queue="warm")  # learn the template first
        results = await client.enqueue_many([Task("a"), Task("b")])
    assert all(isinstance(r, Exception) and "WRONGTYPE" in str(r) for r in results)
    assert await redis.keys(keys.task_key_prefix("default") + "*") == []


async def test_concurrent_callers_share_writes_and_each_gets_its_reply(
    redis: Redis, redis_url: str
) -> None:
    conn = Connection(redis_url)
    try:
        fast = conn.fast
        assert fast is not None
        replies = await asyncio.gather(
            *(fast.execute_command("ECHO", f"caller-{i}") for i in range(2000))
        )
        assert replies == [f"caller-{i}".encode() for i in range(2000)]
        async with Client(conn) as client:
            infos = await asyncio.gather(
                *(client.enqueue(Task("t", b"%d" % i)) for i in range(500))
            )
        assert len({info.id for info in infos}) == 500
        assert await conn.redis.llen(keys.pending_key("default")) == 500
    finally:
        await conn.aclose()


def test_task_ids_are_uuid4_and_a_forked_child_makes_its_own() -> None:
    import subprocess
    import sys
    import uuid

    from asyncq._producer.compose import new_task_id

    ids = [new_task_id() for _ in range(3000)]
    assert len(set(ids)) == 3000
    for text in ids[:600]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    # The fork happens in a fresh single-threaded interpreter (pytest's process has threads).
    script = (
        "import os\n"
        "from asyncq._producer.compose import new_task_id\n"
        "new_task_id()  # the pool now holds ids a child would inherit\n"
        "read, write = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(write, ' '.join(new_task_id() for _ in range(300)).encode())\n"
        "    os._exit(0)\n"
        "os.close(write)\n"
        "os.waitpid(pid, 0)\n"
        "child = os.read(read, 1 << 16).decode().split()\n"
        "parent = [new_task_id() for _ in range(300)]\n"
        "print(len(set(child)), len(set(child) & set(parent)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["300", "0"]


async def test_enqueue_many_learns_one_template_per_option_set_and_keeps_calls_apart(
    redis: Redis,
) -> None:
    # The first task of each option set is composed and its template kept; the others
    # are built from it. Two calls with other call options never share a template.
    async with Client(redis) as client:
        first = await client.enqueue_many(
            [Task("t", b"1"), Task("t", b"2"), Task("t", b"3", max_retry=7)], queue="qa"
        )
        second = await client.enqueue_many(
            [Task("t", b"4"), Task("t", b"5", max_retry=7)], queue="qb"
        )
        cache = client._templates._cache
        assert len(cache) == 4  # (bare, qa), (max_retry, qa), (bare, qb), (max_retry, qb)
    infos = [r for r in first + second if isinstance(r, TaskInfo)]
    assert [(i.queue, i.max_retry) for i in infos] == [
        ("qa", 25), ("qa", 25), ("qa", 7), ("qb", 25), ("qb", 7),
    ]  # fmt: skip
    for info in infos:
        assert info.next_process_at.tzinfo is not None
        stored = await redis.hget(keys.task_key(info.queue, info.id), "msg")
        assert stored is not None
        msg = decode_task_message(stored)
        assert (msg.queue, msg.retry) == (info.queue, info.max_retry)


async def test_enqueue_many_names_an_unknown_call_option(redis: Redis) -> None:
    async with Client(redis) as client:
        with pytest.raises(TypeError, match="the enqueue_many options"):
            await client.enqueue_many([Task("t")], qeue="x")  # type: ignore[call-arg]


async def test_enqueue_many_logs_one_debug_line_per_call(redis: Redis) -> None:
    import structlog
    from structlog.testing import capture_logs

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(10))
    try:
        with capture_logs() as logs:
            async with Client(redis) as client:
                await client.enqueue_many([Task("t"), (Task("t"), {"max_retry": -1})])
    finally:
        structlog.reset_defaults()
    (line,) = [e for e in logs if e["event"] == "batch enqueued"]
    assert (line["log_level"], line["items"], line["written"]) == ("debug", 2, 1)


async def test_enqueue_logs_at_debug_and_sees_a_new_configuration_within_a_second(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import structlog
    from structlog.testing import capture_logs

    clock = [1000.0]  # the logging module's clock only: the event loop keeps its own
    monkeypatch.setattr("asyncq._logging.time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(20))  # INFO
    try:
        async with Client(redis) as client:
            await client.enqueue(Task("t"))  # asks: not at debug
            structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(10))
            with capture_logs() as logs:
                first = await client.enqueue(Task("t"))  # the answer is kept for a second
                clock[0] += 1.0
                second = await client.enqueue(Task("t"))
    finally:
        structlog.reset_defaults()
    (line,) = [e for e in logs if e["event"] == "task enqueued"]
    assert line["task_id"] == second.id != first.id
    assert (line["log_level"], line["queue"], line["state"]) == ("debug", "default", "pending")


async def test_enqueue_many_composes_each_option_set_once(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    composed: list[str] = []
    original = Client._compose_batch_item

    def counting(item: Any, options: Any, now: datetime) -> Any:
        composed.append(item.type if isinstance(item, Task) else item[0].type)
        return original(item, options, now)

    monkeypatch.setattr(Client, "_compose_batch_item", staticmethod(counting))
    async with Client(redis) as client:
        one = await client.enqueue_many([Task("a"), Task("b"), Task("c", max_retry=3), Task("d")])
        two = await client.enqueue_many([Task("e"), Task("f", max_retry=3)])
    assert all(isinstance(r, TaskInfo) for r in one + two)
    assert composed == ["a", "c"]  # the others are built from the templates learned


async def test_enqueue_many_calls_with_other_general_options_share_nothing(redis: Redis) -> None:
    # A deadline needs the general path: no template is learned for it, so the second
    # call's tasks carry the second call's deadline.
    first, second = datetime(2030, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)
    async with Client(redis) as client:
        one = await client.enqueue_many([Task("t"), Task("t")], deadline=first)
        two = await client.enqueue_many([Task("t"), Task("t")], deadline=second)
    for infos, deadline in ((one, first), (two, second)):
        for info in infos:
            assert isinstance(info, TaskInfo)
            stored = await redis.hget(keys.task_key(info.queue, info.id), "msg")
            assert stored is not None
            assert decode_task_message(stored).deadline == int(deadline.timestamp())


async def test_enqueue_many_names_a_malformed_item(redis: Redis) -> None:
    async with Client(redis) as client:
        (result,) = await client.enqueue_many([(Task("t"), {}, "extra")])  # type: ignore[list-item]
    assert isinstance(result, TypeError)
    assert str(result) == "a batch item must be a Task or a (Task, options dict) pair"
