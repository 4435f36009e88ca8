"""SyncClient: the blocking client, shared by threads, same options and errors."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import redis as sync_redis

from asyncq import (
    DuplicateTaskError,
    EnqueueRetryError,
    RetryPolicy,
    Server,
    SyncClient,
    Task,
    TaskArgumentError,
    TaskFailedError,
    TaskState,
)
from asyncq import _keys as keys
from tests.support import typed_app as ta
from tests.support.procs import FAST


@pytest.fixture
def sync_client(redis_url: str) -> Iterator[SyncClient]:
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    r.close()
    with SyncClient(redis_url) as client:
        yield client


@pytest.fixture
async def worker(redis_url: str) -> AsyncIterator[Server]:
    ta.app.redis = redis_url
    server = ta.app.server(**FAST, queues={"default": 1, "email": 1})
    await server.start(ta.app.mux)
    try:
        yield server
    finally:
        await server.shutdown()


def test_enqueue_with_options_and_errors(sync_client: SyncClient) -> None:
    info = sync_client.enqueue(Task("plain", b"x"), queue="low", unique=timedelta(minutes=1))
    assert (info.queue, info.state) == ("low", TaskState.PENDING)
    with pytest.raises(DuplicateTaskError):
        sync_client.enqueue(Task("plain", b"x"), queue="low", unique=timedelta(minutes=1))
    with pytest.raises(ValueError, match="max_retry cannot be negative"):
        sync_client.enqueue(Task("plain"), max_retry=-1)
    results = sync_client.enqueue_many([Task("a"), (Task("b"), {"queue": "low"})])
    assert [r.queue for r in results if not isinstance(r, Exception)] == ["default", "low"]
    with pytest.raises(TaskArgumentError, match="'user_id'"):
        sync_client.send(ta.send_welcome, "nope")  # type: ignore[arg-type]


async def test_typed_send_and_result_from_many_threads(
    sync_client: SyncClient, worker: Server
) -> None:
    def one(i: int) -> Any:
        handle = sync_client.send(ta.add, i, 1)
        return handle.result(timeout=20)

    def run_all() -> list[Any]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(40)))

    import asyncio

    results = await asyncio.to_thread(run_all)
    assert results == [i + 1 for i in range(40)]

    def failing() -> None:
        sync_client.send(ta.fail, "sync boom").result(timeout=20)

    with pytest.raises(TaskFailedError, match="sync boom"):
        await asyncio.to_thread(failing)

    def waited() -> TaskState:
        handle = sync_client.send(ta.send_welcome.options(queue="email"), 3)
        return sync_client.wait(handle.id, queue="email", timeout=20).state

    assert await asyncio.to_thread(waited) is TaskState.COMPLETED


async def test_eager_mode_through_the_sync_client(redis_url: str) -> None:
    import asyncio

    ta.app.redis = redis_url
    async with ta.app.eager():

        def send() -> str:
            with SyncClient(redis_url) as client:
                return client.send(ta.greet, "sam").result()

        # the handler runs on the client's loop thread and still sees the lifespan state
        assert await asyncio.to_thread(send) == "hello, sam"


def test_close_is_idempotent_and_final(redis_url: str) -> None:
    client = SyncClient(redis_url)
    client.ping()
    client.close()
    client.close()
    assert client.closed
    with pytest.raises(RuntimeError, match="closed"):
        client.enqueue(Task("x"))
    assert not any(t.name == "asyncq-sync-client" and t.is_alive() for t in threading.enumerate())


def test_close_ends_a_wait_running_in_another_thread(redis_url: str) -> None:
    # A queue of its own: its completion channel has no subscriber but this test's waiter.
    queue = "sync-close-wait"
    client = SyncClient(redis_url)
    info = client.enqueue(Task("never:handled"), queue=queue, retention=timedelta(minutes=1))
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait(info.id, queue=queue, timeout=60)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    # The waiter is blocked in wait() once it has subscribed to the completion channel.
    probe = sync_redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 20
    while probe.pubsub_numsub(keys.completion_channel(queue))[0][1] == 0:
        assert time.monotonic() < deadline, "wait() never subscribed"
        time.sleep(0.01)
    probe.close()
    client.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "client closed" in str(errors[0])


def test_rejects_a_ready_async_client() -> None:
    from redis.asyncio import Redis

    with pytest.raises(TypeError, match="another event loop"):
        SyncClient(Redis())  # type: ignore[arg-type]


def test_unreachable_redis_raises_the_client_error() -> None:
    # A short deadline: the default policy would retry the refused connection for 5 s.
    policy = RetryPolicy(deadline=timedelta(milliseconds=200))
    with (
        SyncClient("redis://127.0.0.1:1/0", retry=policy) as client,
        pytest.raises(EnqueueRetryError) as caught,
    ):
        client.enqueue(Task("x"))
    assert "connect" in str(caught.value).lower()
    assert caught.value.may_have_written is False
