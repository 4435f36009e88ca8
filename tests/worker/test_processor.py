"""The processor against a real Redis: every outcome path of a task (spec 5.3/5.4),
the task context, results, retention and undecodable messages."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from redis.asyncio import Redis

from asyncq import Limits
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq._worker.result_writer import ResultWriteError
from asyncq.errors import (
    DeadlineExceededError,
    LeaseExpiredError,
    RevokeTask,
    SkipRetry,
    TaskCanceledError,
)
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.helpers import one_handler, wait_gone, wait_state
from tests.support.procs import (
    list_ids,
    stored_message,
    task_hash,
    wait_until,
    zset_ids,
)

Q = "default"
HOUR = timedelta(hours=1)


async def counter(redis: Redis, key: str) -> int:
    value = await redis.get(key)
    return int(value) if value is not None else 0


# -- success -------------------------------------------------------------------------------


async def test_success_deletes_task_and_counts_processed(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    ran = asyncio.Event()

    async def handle(task: Task) -> None:
        ran.set()

    server = await serve(one_handler("ok", handle))
    info = await client.enqueue(Task("ok", b"{}"))
    await wait_gone(redis, info.id)
    assert ran.is_set()
    assert await counter(redis, keys.processed_total_key(Q)) == 1
    assert await counter(redis, keys.failed_total_key(Q)) == 0
    assert await redis.llen(keys.active_key(Q)) == 0
    assert await redis.zcard(keys.lease_key(Q)) == 0
    assert server.stats.succeeded == 1


async def test_task_context_and_result_with_retention(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    seen: dict[str, Any] = {}
    after_return: list[BaseException] = []
    deadline = datetime.now(UTC) + timedelta(minutes=5)

    async def handle(task: Task) -> None:
        seen.update(
            id=task.id,
            queue=task.queue,
            retry_count=task.retry_count,
            max_retry=task.max_retry,
            headers=task.headers,
            deadline=task.deadline,
            payload=task.payload,
        )
        assert task.result_writer is not None
        assert await task.result_writer.write(b"resized:42") == len(b"resized:42")
        writer = task.result_writer

        async def late() -> None:
            await asyncio.sleep(0.05)
            try:
                await writer.write(b"too late")
            except ResultWriteError as exc:
                after_return.append(exc)

        asyncio.get_running_loop().create_task(late())

    await serve(one_handler("image:resize", handle), queues={"media": 1})
    info = await client.enqueue(
        Task("image:resize", b"img", headers={"trace": "abc"}),
        queue="media",
        max_retry=7,
        retention=HOUR,
        deadline=deadline,
    )
    h = await wait_state(redis, info.id, "completed", queue="media")
    assert h[b"result"] == b"resized:42"
    msg = await stored_message(redis, "media", info.id)
    assert msg.completed_at > 0
    assert seen == {
        "id": info.id,
        "queue": "media",
        "retry_count": 0,
        "max_retry": 7,
        "headers": {"trace": "abc"},
        "deadline": datetime.fromtimestamp(int(deadline.timestamp()), UTC),
        "payload": b"img",
    }
    assert await zset_ids(redis, keys.completed_key("media")) == [info.id]
    await wait_until(lambda: after_return, what="late write refused")
    assert "failed to write task result" in str(after_return[0])


async def test_sync_handler_runs_in_worker_thread(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    threads: list[int] = []
    lock = threading.Lock()
    running = peak = 0

    def handle(task: Task) -> None:
        nonlocal running, peak
        with lock:
            threads.append(threading.get_ident())
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)  # blocking is fine here: it is a worker thread
        with lock:
            running -= 1

    await serve(one_handler("sync", handle), concurrency=6, limits=Limits(sync_concurrency=2))
    infos = await client.enqueue_many([Task("sync") for _ in range(6)])
    for info in infos:
        assert not isinstance(info, Exception)
        await wait_gone(redis, info.id)
    assert len(threads) == 6
    assert threading.get_ident() not in threads
    assert peak == 2  # sync_concurrency bounds the worker threads


# -- failures ---------------------------------------------------------------------------------


async def test_exception_is_retried_with_delay_and_error_recorded(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    delays: list[tuple[int, str, str]] = []
    handled: list[tuple[str, str]] = []

    async def handle(task: Task) -> None:
        raise ValueError("bad input")

    def retry_delay(n: int, exc: BaseException, task: Task) -> timedelta:
        delays.append((n, str(exc), task.type))
        return HOUR

    async def error_handler(task: Task, exc: BaseException) -> None:
        handled.append((task.type, str(exc)))

    server = await serve(
        one_handler("boom", handle), retry_delay=retry_delay, error_handler=error_handler
    )
    before = time.time()
    info = await client.enqueue(Task("boom"), max_retry=3)
    await wait_state(redis, info.id, "retry")
    msg = await stored_message(redis, Q, info.id)
    assert msg.retried == 1
    assert msg.error_msg == "ValueError: bad input"
    assert msg.last_failed_at >= int(before)
    score = await redis.zscore(keys.retry_key(Q), info.id)
    assert score is not None and before + 3600 - 1 <= score <= time.time() + 3600
    assert delays == [(0, "bad input", "boom")]
    assert handled == [("boom", "bad input")]
    assert await counter(redis, keys.processed_total_key(Q)) == 1
    assert await counter(redis, keys.failed_total_key(Q)) == 1
    assert server.stats.failed == 1


async def test_retries_exhausted_archives(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    runs: list[int] = []

    async def handle(task: Task) -> None:
        runs.append(task.retry_count)
        raise RuntimeError(f"attempt {task.retry_count}")

    await serve(one_handler("flaky", handle), retry_delay=lambda n, e, t: timedelta(0))
    info = await client.enqueue(Task("flaky"), max_retry=2)
    await wait_state(redis, info.id, "archived")
    assert runs == [0, 1, 2]
    msg = await stored_message(redis, Q, info.id)
    assert msg.retried == 2
    assert msg.error_msg == "RuntimeError: attempt 2"
    assert await zset_ids(redis, keys.archived_key(Q)) == [info.id]
    assert await counter(redis, keys.failed_total_key(Q)) == 3


async def test_skip_retry_archives_at_once(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        raise SkipRetry("not worth retrying")

    await serve(one_handler("skip", handle))
    info = await client.enqueue(Task("skip"), max_retry=10)
    await wait_state(redis, info.id, "archived")
    msg = await stored_message(redis, Q, info.id)
    assert msg.retried == 0
    assert msg.error_msg == "not worth retrying"


async def test_wrapped_skip_retry_archives(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        try:
            raise SkipRetry()
        except SkipRetry as exc:
            raise KeyError("missing") from exc

    await serve(one_handler("skip2", handle))
    info = await client.enqueue(Task("skip2"))
    await wait_state(redis, info.id, "archived")


async def test_revoke_task_deletes_and_counts_processed_only(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        raise RevokeTask()

    await serve(one_handler("revoke", handle))
    info = await client.enqueue(Task("revoke"))
    await wait_gone(redis, info.id)
    assert await counter(redis, keys.processed_total_key(Q)) == 1
    assert await counter(redis, keys.failed_total_key(Q)) == 0
    assert await redis.zcard(keys.archived_key(Q)) == 0
    assert await redis.zcard(keys.retry_key(Q)) == 0


async def test_is_failure_false_retries_without_counting(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    class RateLimited(Exception):
        pass

    async def handle(task: Task) -> None:
        raise RateLimited("slow down")

    await serve(
        one_handler("limited", handle),
        is_failure=lambda exc: not isinstance(exc, RateLimited),
        retry_delay=lambda n, e, t: HOUR,
    )
    info = await client.enqueue(Task("limited"), max_retry=1)
    await wait_state(redis, info.id, "retry")
    msg = await stored_message(redis, Q, info.id)
    assert msg.retried == 0
    assert "slow down" in msg.error_msg
    assert await counter(redis, keys.processed_total_key(Q)) == 0
    assert await counter(redis, keys.failed_total_key(Q)) == 0


async def test_handler_not_found_is_a_failure(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    await serve(ServeMux(), retry_delay=lambda n, e, t: HOUR)
    info = await client.enqueue(Task("nobody:home"))
    await wait_state(redis, info.id, "retry")
    msg = await stored_message(redis, Q, info.id)
    assert msg.error_msg == "handler not found for task 'nobody:home'"
    assert msg.retried == 1


async def test_timeout_and_deadline_cancel_the_handler(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    cancelled: list[str] = []

    async def handle(task: Task) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(task.type)
            raise

    mux = ServeMux()
    mux.handle("slow:timeout", handle)
    mux.handle("slow:deadline", handle)
    errors: list[BaseException] = []
    await serve(mux, retry_delay=lambda n, e, t: HOUR, error_handler=lambda t, e: errors.append(e))
    a = await client.enqueue(Task("slow:timeout"), timeout=timedelta(seconds=1))
    # Far enough ahead that the handler has started when it comes, on a busy machine too
    # (stored in whole seconds, a deadline 1 s ahead could pass before the fetch, and the
    # task then fails unrun: test_deadline_already_passed_fails_without_running).
    b = await client.enqueue(
        Task("slow:deadline"), deadline=datetime.now(UTC) + timedelta(seconds=5)
    )
    for info in (a, b):
        await wait_state(redis, info.id, "retry")
        msg = await stored_message(redis, Q, info.id)
        assert msg.error_msg == "context deadline exceeded"
        assert msg.retried == 1
    assert sorted(cancelled) == ["slow:deadline", "slow:timeout"]
    assert all(isinstance(e, DeadlineExceededError) for e in errors)
    assert all(isinstance(e, TimeoutError) for e in errors)


async def test_deadline_already_passed_fails_without_running(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    ran: list[str] = []

    async def handle(task: Task) -> None:
        ran.append(task.id or "")

    info = await client.enqueue(
        Task("late"), deadline=datetime.now(UTC) - timedelta(seconds=5), max_retry=0
    )
    await serve(one_handler("late", handle))
    await wait_state(redis, info.id, "archived")
    assert ran == []
    assert (await stored_message(redis, Q, info.id)).error_msg == "context deadline exceeded"


async def test_cancel_through_channel_retries_the_task(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    started = asyncio.Event()

    async def handle(task: Task) -> None:
        started.set()
        await asyncio.sleep(60)

    errors: list[BaseException] = []
    server = await serve(
        one_handler("long", handle),
        retry_delay=lambda n, e, t: HOUR,
        error_handler=lambda t, e: errors.append(e),
    )
    info = await client.enqueue(Task("long"))
    await asyncio.wait_for(started.wait(), 10)
    await client.broker.publish_cancelation(info.id)
    await wait_state(redis, info.id, "retry")
    msg = await stored_message(redis, Q, info.id)
    assert msg.error_msg == "context canceled"
    assert msg.retried == 1
    assert isinstance(errors[0], TaskCanceledError)
    assert server.stats.failed == 1


async def test_cancel_of_unknown_task_is_ignored(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        return None

    server = await serve(one_handler("x", handle))
    await client.broker.publish_cancelation("no-such-task")
    info = await client.enqueue(Task("x"))
    await wait_gone(redis, info.id)
    assert server.stats.failed == 0


async def test_expired_local_lease_cancels_handler_and_writes_nothing(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    started = asyncio.Event()
    errors: list[BaseException] = []

    async def handle(task: Task) -> None:
        started.set()
        await asyncio.sleep(60)

    server = await serve(one_handler("leased", handle), error_handler=lambda t, e: errors.append(e))
    info = await client.enqueue(Task("leased"))
    await asyncio.wait_for(started.wait(), 10)
    # Simulate a lease that ran out (e.g. the loop was blocked past the lease).
    server.processor.active[info.id].lease.expires_at = time.time() - 1
    await wait_until(lambda: errors, what="lease expiry failure")
    assert isinstance(errors[0], LeaseExpiredError)
    await wait_until(lambda: not server.processor.active, what="handler finished")
    # Nothing was written: the task is still active, for the recoverer.
    h = await task_hash(redis, Q, info.id)
    assert h[b"state"] == b"active"
    assert await list_ids(redis, keys.active_key(Q)) == [info.id]
    assert await counter(redis, keys.failed_total_key(Q)) == 0


async def test_misbehaving_callbacks_fall_back_to_defaults(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        raise ValueError("x")

    def bad_delay(n: int, e: BaseException, t: Task) -> timedelta:
        raise RuntimeError("buggy retry_delay")

    def bad_is_failure(exc: BaseException) -> bool:
        raise RuntimeError("buggy is_failure")

    def bad_error_handler(task: Task, exc: BaseException) -> None:
        raise RuntimeError("buggy error handler")

    await serve(
        one_handler("cb", handle),
        retry_delay=bad_delay,
        is_failure=bad_is_failure,
        error_handler=bad_error_handler,
    )
    before = time.time()
    info = await client.enqueue(Task("cb"))
    await wait_state(redis, info.id, "retry")
    score = await redis.zscore(keys.retry_key(Q), info.id)
    assert score is not None and score >= int(before) + 15  # asynq's default: >= 15 s
    assert (await stored_message(redis, Q, info.id)).retried == 1  # counted as a failure


async def test_undecodable_message_is_archived_and_worker_goes_on(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    done: list[str] = []

    async def handle(task: Task) -> None:
        done.append(task.id or "")

    # A task hash whose msg is not a TaskMessage, queued before a good task.
    await redis.sadd(keys.ALL_QUEUES, Q)
    await redis.hset(
        keys.task_key(Q, "garbage"), mapping={"msg": b"\xff\xff\xff", "state": "pending"}
    )
    await redis.lpush(keys.pending_key(Q), "garbage")
    good = await client.enqueue(Task("good"))
    await serve(one_handler("good", handle))
    await wait_until(lambda: done == [good.id], what="good task processed")
    h = await task_hash(redis, Q, "garbage")
    assert h[b"state"] == b"archived"
    assert await zset_ids(redis, keys.archived_key(Q)) == ["garbage"]


async def test_concurrency_bounds_running_handlers(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    running = 0
    peak = 0

    async def handle(task: Task) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    await serve(one_handler("c", handle), concurrency=3)
    await client.enqueue_many([Task("c") for _ in range(30)])
    await wait_until(lambda: redis.exists(keys.processed_total_key(Q)), what="first processed")

    async def all_done() -> bool:
        return await counter(redis, keys.processed_total_key(Q)) == 30

    await wait_until(all_done, what="30 tasks processed")
    assert peak == 3


async def test_outcome_for_a_task_gone_from_active_is_logged_not_fatal(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def handle(task: Task) -> None:
        started.set()
        await release.wait()

    with structlog.testing.capture_logs() as logs:
        server = await serve(one_handler("gone", handle))
        info = await client.enqueue(Task("gone"))
        await asyncio.wait_for(started.wait(), 10)
        # Someone else moved the task on (e.g. a recoverer after a lost lease).
        await redis.lrem(keys.active_key(Q), 0, info.id)
        await redis.zrem(keys.lease_key(Q), info.id)
        release.set()
        await wait_until(
            lambda: any(e["event"] == "task outcome rejected by Redis" for e in logs),
            what="rejection logged",
        )
        later = await client.enqueue(Task("gone"))
        await wait_gone(redis, later.id)
    rejected = next(e for e in logs if e["event"] == "task outcome rejected by Redis")
    assert rejected["task_id"] == info.id and rejected["log_level"] == "error"
    assert server.stats.succeeded == 2
