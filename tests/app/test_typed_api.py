"""The typed task API: typed enqueue, JSON payloads, awaited results, lifespan, eager mode."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import (
    App,
    Client,
    ServeMux,
    Server,
    Task,
    TaskArgumentError,
    TaskFailedError,
    TaskNotFoundError,
    TaskState,
    lifespan_state,
)
from asyncq._keys import completion_channel
from asyncq._worker.completion import CompletionNotifier
from tests.support import typed_app as ta
from tests.support.procs import FAST, ROOT, task_hash, wait_until


@pytest.fixture
async def worker(app: App[ta.State]) -> AsyncIterator[Server]:
    server = app.server(**FAST, queues={"default": 1, "email": 1})
    await server.start(app.mux)
    try:
        yield server
    finally:
        await server.shutdown()


# -- payloads -------------------------------------------------------------------------------


async def test_payload_is_one_json_object_keyed_by_parameter(app: App[Any], redis: Redis) -> None:
    handle = await ta.send_welcome.enqueue(42)
    stored = await task_hash(redis, "default", handle.id)
    assert stored[b"state"] == b"pending"
    assert handle.info.payload == b'{"user_id":42,"lang":"en"}'
    assert handle.info.type == "email:welcome"
    assert handle.info.max_retry == 2  # the decorator's default
    assert handle.info.retention == timedelta(minutes=5)  # results are kept for awaiting


async def test_keyword_and_positional_give_the_same_payload(app: App[Any]) -> None:
    a = await ta.send_welcome.enqueue(7, "de")
    b = await ta.send_welcome.enqueue(lang="de", user_id=7)
    assert a.info.payload == b.info.payload == b'{"user_id":7,"lang":"de"}'


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: ta.send_welcome.enqueue("42"),
            r"argument 'user_id': Input should be a valid integer",
        ),
        (
            lambda: ta.send_welcome.enqueue(1, lang=3),
            r"argument 'lang': Input should be a valid string",
        ),
        (ta.send_welcome.enqueue, r"missing required argument: 'user_id'"),
        (lambda: ta.send_welcome.enqueue(1, colour="x"), r"unexpected keyword argument 'colour'"),
        (lambda: ta.send_welcome.enqueue(1, user_id=2), r"multiple values for argument 'user_id'"),
        (lambda: ta.send_welcome.enqueue(1, "de", 3), r"takes 2 positional arguments but 3"),
        (lambda: ta.positional.enqueue(a=1), r"positional-only argument passed as keyword: 'a'"),
        (
            lambda: ta.echo_kinds.enqueue(
                datetime.now(UTC),
                UUID(int=1),
                ta.Profile(name="x"),
                ta.Point(1, 2),
                "red",
                Decimal(1),
                {"start": datetime.now(UTC), "end": datetime.now(UTC)},
                [],
            ),
            r"argument 'color': Input should be an instance of Color",
        ),
    ],
)
async def test_bad_arguments_fail_at_enqueue_naming_the_argument(
    app: App[Any], redis: Redis, call: Any, match: str
) -> None:
    with pytest.raises(TaskArgumentError, match=match):
        await call()
    assert await redis.keys("asynq:*") == []  # nothing was written


async def test_options_override_decorator_defaults(app: App[Any], redis: Redis) -> None:
    handle = await ta.send_welcome.options(
        queue="email", max_retry=9, process_in=timedelta(hours=1), task_id="fixed-id"
    ).enqueue(1)
    assert (handle.id, handle.queue, handle.info.max_retry) == ("fixed-id", "email", 9)
    assert handle.info.state is TaskState.SCHEDULED
    later = ta.send_welcome.options(queue="email", process_in=timedelta(hours=1))
    sooner = later.options(process_at=datetime.now(UTC) + timedelta(minutes=1), queue=None)
    handle = await sooner.enqueue(2)  # process_at replaces process_in; None keeps the queue
    assert handle.queue == "email" and handle.info is not None
    assert handle.info.next_process_at is not None
    assert handle.info.next_process_at < datetime.now(UTC) + timedelta(minutes=2)
    task = ta.send_welcome.options(queue="email").to_task(1)
    assert (task.type, task.payload, task.options["queue"]) == (
        "email:welcome",
        b'{"user_id":1,"lang":"en"}',
        "email",
    )


def test_options_are_checked_at_decoration() -> None:
    other = App("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="max_retry cannot be negative"):
        other.task(max_retry=-1)(ta.add.fn)
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):

        @other.task
        async def variadic(*items: int) -> None: ...

    @other.task
    async def once(x: int) -> int:
        return x

    assert once.name == f"{__name__}.test_options_are_checked_at_decoration.<locals>.once"
    with pytest.raises(ValueError, match="already registered"):
        other.task(name=once.name)(ta.add.fn)


kinds_args = st.fixed_dictionaries(
    {
        "when": st.datetimes(timezones=st.just(UTC)),
        "ident": st.uuids(),
        "profile": st.builds(ta.Profile, name=st.text(), tags=st.lists(st.text(), max_size=3)),
        "point": st.builds(
            ta.Point,
            x=st.floats(allow_nan=False, allow_infinity=False),
            y=st.floats(allow_nan=False, allow_infinity=False),
        ),
        "color": st.sampled_from(ta.Color),
        "amount": st.decimals(allow_nan=False, allow_infinity=False, places=4),
        "window": st.fixed_dictionaries(
            {
                "start": st.datetimes(timezones=st.just(UTC)),
                "end": st.datetimes(timezones=st.just(UTC)),
            }
        ),
        "tags": st.lists(st.text(), max_size=4),
        "extra": st.none() | st.dictionaries(st.text(), st.integers(-(2**53), 2**53), max_size=3),
    }
)


@given(kinds_args)
@settings(max_examples=60, deadline=None)
def test_every_argument_kind_survives_the_json_round_trip(args: dict[str, Any]) -> None:
    """What the worker decodes equals what the producer passed (codec only, no Redis)."""
    payload = ta.echo_kinds._args.encode((), args)
    assert isinstance(json.loads(payload), dict)  # one JSON object a Go struct can take
    assert ta.echo_kinds._args.decode(payload) == args
    result = ta.Kinds(**args)
    assert ta.echo_kinds._results.decode(ta.echo_kinds._results.encode(result)) == result


# -- results --------------------------------------------------------------------------------


async def test_typed_round_trip_through_a_worker(app: App[ta.State], worker: Server) -> None:
    handle = await ta.send_welcome.enqueue(42, lang="de")
    receipt = await handle.result(timeout=10)
    assert receipt == ta.Receipt(user_id=42, lang="de", task_id=handle.id)
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    args: dict[str, Any] = {
        "when": now,
        "ident": UUID(int=99),
        "profile": ta.Profile(name="ada", tags=["x"]),
        "point": ta.Point(1.5, -2),
        "color": ta.Color.BLUE,
        "amount": Decimal("12.50"),
        "window": {"start": now, "end": now + timedelta(hours=1)},
        "tags": ["a", "b"],
        "extra": {"n": 1},
    }
    kinds = await (await ta.echo_kinds.enqueue(**args)).result(timeout=10)
    assert kinds == ta.Kinds(**args)
    assert await (await ta.add.enqueue(2, 3)).result(timeout=10) == 5  # a sync def handler
    assert await (await ta.positional.enqueue(5)).result(timeout=10) == [5, 2]


async def test_result_is_woken_by_the_notification_not_by_polling(
    app: App[Any], worker: Server
) -> None:
    handle = await ta.sleep.enqueue(0.2)
    started = time.monotonic()
    # A poll interval of a minute: only the completion notification can end this wait.
    assert await handle.result(timeout=30, poll_interval=timedelta(minutes=1)) == 0.2
    assert time.monotonic() - started < 30


async def test_archived_task_raises_with_its_last_error(app: App[Any], worker: Server) -> None:
    handle = await ta.fail.enqueue("the disk is full")
    with pytest.raises(TaskFailedError, match="the disk is full") as caught:
        await handle.result(timeout=10, poll_interval=timedelta(minutes=1))
    assert caught.value.task_id == handle.id
    assert "the disk is full" in caught.value.last_error
    assert caught.value.info.state is TaskState.ARCHIVED


async def test_timeout_raises_timeout_error(app: App[Any]) -> None:
    handle = await ta.send_welcome.enqueue(1)  # no worker
    with pytest.raises(TimeoutError, match=r"did not complete within 0\.3s"):
        await handle.result(timeout=0.3)


async def test_unknown_task_raises_not_found(app: App[Any]) -> None:
    with pytest.raises(TaskNotFoundError):
        await app.wait("no-such-task", timeout=1)


async def test_go_worker_result_is_found_by_the_polling_fallback(
    app: App[Any], redis: Redis
) -> None:
    """A Go worker marks the task completed and writes the result, publishing nothing."""
    handle = await ta.send_welcome.enqueue(5)
    key = f"asynq:{{default}}:t:{handle.id}"

    async def go_worker() -> None:
        await asyncio.sleep(0.3)
        await redis.lrem("asynq:{default}:pending", 0, handle.id)
        await redis.hset(
            key,
            mapping={
                "state": "completed",
                "result": json.dumps({"user_id": 5, "lang": "en", "task_id": "go"}),
            },
        )

    writer = asyncio.create_task(go_worker())
    receipt = await handle.result(timeout=10, poll_interval=timedelta(milliseconds=200))
    await writer
    assert receipt == ta.Receipt(user_id=5, lang="en", task_id="go")


async def test_dropped_notification_falls_back_to_polling(
    app: App[Any], worker: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert worker.processor is not None
    sent: list[str] = []
    monkeypatch.setattr(CompletionNotifier, "notify", lambda self, q, tid: sent.append(tid))
    handle = await ta.send_welcome.enqueue(3)
    receipt = await handle.result(timeout=10, poll_interval=timedelta(milliseconds=200))
    assert receipt.user_id == 3
    assert sent == [handle.id]  # the worker did try to notify; the message never went out


async def test_client_wait_and_notification_channel(
    app: App[Any], redis: Redis, worker: Server
) -> None:
    pubsub = redis.pubsub()
    await pubsub.subscribe(completion_channel("default"))
    handle = await ta.add.enqueue(1, 1)
    info = await app.client.wait(handle.id, queue="default", timeout=10)
    assert info.state is TaskState.COMPLETED and info.result == b"2"
    message = None
    async with asyncio.timeout(5):
        while message is None or message["type"] != "message":
            message = await pubsub.get_message(timeout=1)
    assert message["data"] == handle.id.encode()
    await pubsub.aclose()


async def test_many_concurrent_waiters_share_one_subscription(
    app: App[Any], worker: Server
) -> None:
    handles = [await ta.add.enqueue(i, i) for i in range(30)]
    results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
    assert results == [2 * i for i in range(30)]


async def test_result_not_kept_without_retention(app: App[Any], worker: Server) -> None:
    handle = await ta.add.options(retention=timedelta(0)).enqueue(1, 2)
    with pytest.raises(TaskNotFoundError):
        await wait_until(lambda: _gone(app.client, handle.id), what="task deleted")
        await handle.result(timeout=5)


async def _gone(client: Client, task_id: str) -> bool:
    return not await client.redis.exists(f"asynq:{{default}}:t:{task_id}")


async def test_results_across_processes(app: App[Any], redis_url: str, tmp_path: Path) -> None:
    """A worker subprocess (``asyncq worker`` on an async factory) and waiters in this one."""
    events = tmp_path / "events"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TYPED_APP_GREETING": "hi from the worker",
        "TYPED_APP_EVENTS_FILE": str(events),
    }
    env.pop("ASYNCQ_REDIS_URL", None)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "asyncq.cli", "-u", redis_url, "worker",
          "tests.support.typed_app:create_app_async", "-q", "default", "-c", "4"],
        env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(60):  # a SIGTERM before the handlers are installed kills it
            while b"send signal TERM or INT" not in await proc.stderr.readline():
                pass
        greeting = await (await ta.greet.enqueue("you")).result(timeout=30)
        assert greeting == "hi from the worker, you"
        with pytest.raises(TaskFailedError, match="no luck"):
            await (await ta.fail.enqueue("no luck")).result(timeout=30)
        loop_module = await (await ta.loop_kind.enqueue()).result(timeout=30)
        expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
        assert loop_module.startswith(expected)  # the worker runs on uvloop when installed
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert events.read_text().split() == ["enter", "exit"]


# -- interoperability with the Go-shaped API -------------------------------------------------


async def test_typed_task_handled_by_a_plain_mux_handler(app: App[Any], redis: Redis) -> None:
    seen: list[Any] = []
    mux = ServeMux()

    @mux.handler("email:welcome")
    async def plain(task: Task) -> None:
        seen.append(task.json())
        assert task.result_writer is not None
        await task.result_writer.write(b'{"user_id":1,"lang":"xx","task_id":"plain"}')

    async with Server(redis, **FAST) as server:
        await server.start(mux)
        handle = await ta.send_welcome.enqueue(1)
        assert (await handle.result(timeout=10)).lang == "xx"
    assert seen == [{"user_id": 1, "lang": "en"}]


async def test_plain_task_handled_by_a_typed_handler(app: App[Any], worker: Server) -> None:
    client = app.client
    info = await client.enqueue(
        Task.from_json("email:welcome", {"user_id": "17"}), retention=timedelta(minutes=1)
    )  # a Go producer: a numeric string, the default left out
    done = await client.wait(info.id, timeout=10)
    assert json.loads(done.result or b"") == {"user_id": 17, "lang": "en", "task_id": info.id}


async def test_bad_payload_is_archived_without_retries(app: App[Any], worker: Server) -> None:
    info = await app.client.enqueue(Task("email:welcome", b'{"lang": 5}'), max_retry=5)
    with pytest.raises(TaskFailedError, match="payload field 'user_id': Field required"):
        await app.client.wait(info.id, timeout=10)


# -- lifespan and eager mode ------------------------------------------------------------------


async def test_lifespan_state_in_handlers_and_closed_on_shutdown(app: App[ta.State]) -> None:
    server = app.server(**FAST)
    await server.start(app.mux)
    try:
        assert ta.EVENTS == ["enter"]
        assert await (await ta.greet.enqueue("ann")).result(timeout=10) == "hello, ann"
        with pytest.raises(RuntimeError, match="no lifespan state"):
            lifespan_state()  # the code that started the server does not see it
    finally:
        await server.shutdown()
    assert ta.EVENTS == ["enter", "exit"]


async def test_server_lifespan_with_plain_handlers(redis: Redis) -> None:
    from contextlib import asynccontextmanager

    closed: list[bool] = []

    @asynccontextmanager
    async def span() -> AsyncIterator[dict[str, int]]:
        yield {"answer": 42}
        closed.append(True)

    seen: list[int] = []

    async def handler(task: Task) -> None:
        seen.append(lifespan_state()["answer"])

    async with Server(redis, lifespan=span, **FAST) as server:
        await server.start(handler)
        await Client(redis).enqueue(Task("x"))
        await wait_until(lambda: seen, what="handler ran")
    assert seen == [42] and closed == [True]


async def test_failing_lifespan_fails_start(redis: Redis) -> None:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def broken() -> AsyncIterator[None]:
        raise OSError("database unreachable")
        yield

    server = Server(redis, lifespan=broken, **FAST)
    with pytest.raises(OSError, match="database unreachable"):
        await server.start(ServeMux())
    assert server.state == "new"  # nothing was started
    await server.shutdown()
    with pytest.raises(TypeError, match="lifespan must be callable"):
        Server(redis, lifespan=42)  # type: ignore[arg-type]


async def test_eager_mode_runs_in_process(app: App[ta.State], redis: Redis) -> None:
    async with app.eager():
        handle = await ta.greet.enqueue("bo")
        assert await handle.result() == "hello, bo"
        assert app.state.events == ["bo"]
        with pytest.raises(TaskFailedError, match="boom") as caught:
            await (await ta.fail.enqueue("boom")).result()
        assert isinstance(caught.value.__cause__, ValueError)
        with pytest.raises(TaskArgumentError, match="'user_id'"):
            await ta.send_welcome.enqueue("x")  # type: ignore[arg-type]
    assert ta.EVENTS == ["enter", "exit"]
    assert await redis.keys("*") == []  # eager mode never touches Redis


def test_worker_command_loads_an_app_or_a_factory() -> None:
    from asyncq.cli.worker import load_app

    assert load_app("tests.support.typed_app:app") is ta.app
    assert load_app("tests.support.typed_app:create_app") is ta.app
    made = load_app("tests.support.typed_app:create_app_async")
    assert asyncio.iscoroutine(made)  # awaited in the worker's event loop
    assert asyncio.run(made) is ta.app


async def test_pointing_the_app_elsewhere_drops_its_client(app: App[Any]) -> None:
    first = app.client
    assert app.client is first
    await app.aclose()
    app.redis = str(app.redis)
    assert app.client is not first


async def test_calling_a_task_runs_the_function(app: App[Any]) -> None:
    assert await ta.add(1, 2) == 3
    assert await ta.positional(1) == [1, 2]


@pytest.mark.cluster
@pytest.mark.xdist_group("cluster-typed")
async def test_results_on_a_redis_cluster(cluster: Any) -> None:
    """No Pub/Sub in redis-py's asyncio cluster client: the waiter polls, the worker still runs."""
    from redis.asyncio.cluster import RedisCluster

    other = App(cluster.url)

    @other.task(name="cluster:square", queue="reports:eu")
    async def square(n: int) -> int:
        return n * n

    async with Client(cluster.url) as client:
        await client.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
        server = other.server(**FAST, queues={"reports:eu": 1})
        await server.start(other.mux)
        try:
            handle = await square.options(client=client).enqueue(12)
            result = await handle.result(timeout=30, poll_interval=timedelta(milliseconds=100))
            assert result == 144
        finally:
            await server.shutdown()
