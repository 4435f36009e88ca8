"""Client(retry=...): enqueues ride through connection failures without duplicating a task."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq import Client, EnqueueRetryError, RetryPolicy, Task, TaskIdConflictError
from asyncq import _keys as keys
from asyncq._broker import Broker
from tests.support.cluster import SentinelSetup, redis_cli
from tests.support.helpers import wait_until
from tests.support.redis_server import free_port

Q = "retry-q"


def test_policy_is_validated() -> None:
    with pytest.raises(ValueError, match="deadline must be positive"):
        RetryPolicy(deadline=timedelta(0))
    with pytest.raises(TypeError, match=r"initial_backoff must be a datetime\.timedelta"):
        RetryPolicy(initial_backoff=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_backoff"):
        RetryPolicy(initial_backoff=timedelta(seconds=2), max_backoff=timedelta(seconds=1))
    with pytest.raises(TypeError, match="retry must be a RetryPolicy or None"):
        Client("redis://localhost:1", retry=5)  # type: ignore[arg-type]


async def test_unreachable_redis_fails_after_the_deadline_saying_nothing_was_written() -> None:
    policy = RetryPolicy(deadline=timedelta(milliseconds=300))
    async with Client(f"redis://127.0.0.1:{free_port()}", retry=policy) as client:
        start = time.monotonic()
        with pytest.raises(EnqueueRetryError) as info:
            await client.enqueue(Task("t"), queue=Q, task_id="never")
        assert time.monotonic() - start >= 0.3
    err = info.value
    assert err.task_id == "never" and err.queue == Q
    assert err.attempts >= 2
    assert err.may_have_written is False
    assert "the task was not written" in str(err)
    assert isinstance(err.__cause__, RedisConnectionError)


async def test_retry_none_raises_the_connection_error_at_once() -> None:
    async with Client(f"redis://127.0.0.1:{free_port()}", retry=None) as client:
        with pytest.raises(RedisConnectionError):
            await client.enqueue(Task("t"), queue=Q)


def lose_first_reply(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first Broker.write runs in Redis, then its reply is 'lost'."""
    real = Broker.write
    calls: list[int] = []

    async def flaky(self: Broker, *args: Any) -> Any:
        calls.append(1)
        result = await real(self, *args)
        if len(calls) == 1:
            raise RedisConnectionError("Connection reset by peer while reading the reply")
        return result

    monkeypatch.setattr(Broker, "write", flaky)
    return calls


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"task_id": "explicit-1"},
        {"unique": timedelta(hours=1)},
        {"process_in": timedelta(hours=1)},
        {"group": "g1"},
    ],
)
async def test_a_lost_reply_is_resolved_without_a_duplicate(
    redis: Redis, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    calls = lose_first_reply(monkeypatch)
    async with Client(redis) as client:
        info = await client.enqueue(Task("t", b"payload"), queue=Q, **options)
    assert len(calls) == 2  # the retry ran and found its own task
    assert await redis.exists(keys.task_key(Q, info.id)) == 1
    members = await redis.lrange(keys.pending_key(Q), 0, -1)
    members += await redis.zrange(keys.scheduled_key(Q), 0, -1)
    members += await redis.zrange(keys.group_key(Q, "g1"), 0, -1)
    assert members == [info.id.encode()]


async def test_a_real_conflict_after_a_failure_is_still_a_conflict(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("other", b"theirs"), queue=Q, task_id="taken")
        real = Broker.write
        calls: list[int] = []

        async def refused_then_real(self: Broker, *args: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Refused.")
            return await real(self, *args)

        monkeypatch.setattr(Broker, "write", refused_then_real)
        with pytest.raises(TaskIdConflictError):
            await client.enqueue(Task("mine", b"mine"), queue=Q, task_id="taken")


@pytest.fixture
def failover_setup() -> Iterator[SentinelSetup]:
    setup = SentinelSetup().start()
    try:
        yield setup
    finally:
        setup.cleanup()


@pytest.mark.sentinel
@pytest.mark.slow
async def test_steady_producer_rides_through_a_master_sigkill(
    failover_setup: SentinelSetup,
) -> None:
    """SIGKILL the master under a steady producer: 0 errors, 0 lost, 0 duplicated.

    The producers hold still for the instant of the kill, once the replica has everything
    the master acknowledged: an enqueue acknowledged by the master and not yet shipped to
    the replica dies with it (Redis replicates asynchronously; ``min_replicas`` is the
    answer to that, tested in test_min_replicas.py), which would be a race, not the
    client's retry through the failover that this tests. They go on at once after it.
    """
    setup = failover_setup
    policy = RetryPolicy(deadline=timedelta(seconds=30))
    ledger: list[str] = []
    unique_ids: list[str] = []
    errors: list[BaseException] = []
    stop = asyncio.Event()
    go = asyncio.Event()
    go.set()
    held = 0

    counter = itertools.count(1)

    def replica_has_everything() -> bool:
        def offset(port: int, field: str) -> int:
            info = redis_cli(port, "info", "replication")
            return int(info.split(f"{field}:", 1)[1].split()[0])

        master = offset(setup.master.port, "master_repl_offset")
        return offset(setup.replica.port, "slave_repl_offset") >= master

    async def produce(client: Client) -> None:
        nonlocal held
        while not stop.is_set():
            if not go.is_set():
                held += 1
                await go.wait()
                held -= 1
            n = next(counter)
            try:
                if n % 3 == 0:
                    info = await client.enqueue(
                        Task("u", f"unique-{n}".encode()), queue=Q, unique=timedelta(hours=1)
                    )
                    unique_ids.append(info.id)
                elif n % 3 == 1:
                    info = await client.enqueue(Task("e", b"x"), queue=Q, task_id=f"explicit-{n}")
                else:
                    info = await client.enqueue(Task("p", b"x"), queue=Q)
                ledger.append(info.id)
            except Exception as exc:
                errors.append(exc)
            await asyncio.sleep(0.005)

    async with Client(setup.url, retry=policy) as client:
        producers = [asyncio.create_task(produce(client)) for _ in range(3)]
        # Some of each kind on the first master before it dies.
        await wait_until(lambda: len(ledger) >= 30, within=60, what="tasks on the first master")
        go.clear()
        await wait_until(lambda: held == len(producers), what="the producers to hold")
        await wait_until(replica_has_everything, what="the replica to have every enqueue")
        before_kill = len(ledger)
        assert setup.master.proc is not None
        setup.master.proc.kill()  # SIGKILL: no goodbye to replica or sentinel
        go.set()  # their next enqueues meet the dead master and ride through the failover
        deadline = time.monotonic() + 60
        while setup.master_port() != setup.replica.port:
            assert time.monotonic() < deadline, "no failover"
            await asyncio.sleep(0.2)
        after_failover = len(ledger)
        await wait_until(  # keep producing on the new master
            lambda: len(ledger) >= after_failover + 30, within=60, what="tasks on the new master"
        )
        stop.set()
        await asyncio.gather(*producers)

    assert errors == []
    assert before_kill > 0 and len(ledger) > before_kill
    new_master = Redis(port=setup.replica.port)
    try:
        stored = Counter(m.decode() for m in await new_master.lrange(keys.pending_key(Q), 0, -1))
        unique_locks = 0
        for tid in unique_ids:
            msg = await new_master.hget(keys.task_key(Q, tid), "msg")
            assert msg is not None
            unique_locks += 1
    finally:
        await new_master.aclose()
    assert len(set(ledger)) == len(ledger)
    lost = [tid for tid in ledger if stored[tid] == 0]
    duplicated = [tid for tid, n in stored.items() if n > 1]
    unknown = [tid for tid in stored if tid not in set(ledger)]
    assert (lost, duplicated, unknown) == ([], [], [])
    assert unique_locks == len(unique_ids) > 0
    assert any(tid.startswith("explicit-") for tid in ledger)
