"""PeriodicTaskManager: provider diffing, invalid rounds, and two managers side by side."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from asyncq._scheduling.periodic import PeriodicTaskConfig, PeriodicTaskManager
from asyncq.proto.asynq import SchedulerEntry
from asyncq.task import Task, TaskInfo
from tests.support.helpers import wait_until

FAST: dict[str, Any] = {
    "heartbeat_interval": timedelta(seconds=1),
    "claim_lease": timedelta(milliseconds=500),
}


def cfg(spec: str, type_: str, payload: bytes = b"", **options: Any) -> PeriodicTaskConfig:
    return PeriodicTaskConfig(spec, Task(type_, payload), options)


async def listed_types(redis: Redis, manager: PeriodicTaskManager) -> list[str]:
    raw = await redis.lrange(f"asynq:schedulers:{{{manager.scheduler.id}}}", 0, -1)
    return sorted(SchedulerEntry.parse(b).task_type for b in raw)


async def test_sync_registers_added_and_unregisters_removed(redis: Redis, redis_url: str) -> None:
    configs = [cfg("@hourly", "a"), cfg("0 9 * * *", "b", b"1", queue="q")]
    manager = PeriodicTaskManager(redis_url, lambda: configs, **FAST)
    async with manager:
        assert await listed_types(redis, manager) == ["a", "b"]
        before = manager.entries
        assert len(before) == 2

        # Same spec/type/payload/options: nothing changes (new Task objects are fine).
        configs = [cfg("@hourly", "a"), cfg("0 9 * * *", "b", b"1", queue="q")]
        result = await manager.sync()
        assert result.added == [] and result.removed == []
        assert manager.entries == before

        # Changing an option is a different entry: old one out, new one in.
        configs = [
            cfg("@hourly", "a"),
            cfg("0 9 * * *", "b", b"1", queue="other"),
            cfg("@daily", "c"),
        ]
        result = await manager.sync()
        assert len(result.added) == 2 and len(result.removed) == 1
        assert set(result.removed) < set(before.values())
        assert set(manager.scheduler.entries) == set(manager.entries.values())
        specs = sorted(
            (s, t.type, o.get("queue")) for s, t, o in manager.scheduler.entries.values()
        )
        assert specs == [("0 9 * * *", "b", "other"), ("@daily", "c", None), ("@hourly", "a", None)]

        async def listed() -> bool:
            return await listed_types(redis, manager) == ["a", "b", "c"]

        await wait_until(listed)
    assert await redis.keys("asynq:schedulers:*") == []


async def test_an_invalid_round_changes_nothing(redis: Redis, redis_url: str) -> None:
    good = [cfg("@hourly", "a"), cfg("@daily", "b")]
    configs: list[Any] = list(good)
    manager = PeriodicTaskManager(redis_url, lambda: configs, **FAST)
    async with manager:
        before = manager.entries
        bad_rounds: list[tuple[list[Any], str]] = [
            (
                [cfg("@hourly", "a"), cfg("61 * * * *", "x")],
                r"config #1 \(cronspec='61 \* \* \* \*'",
            ),
            ([cfg("@hourly", "a"), cfg("@daily", "b", queue="")], "queue name"),
            ([cfg("@hourly", "a"), cfg("@daily", "b", retries=3)], "retries"),
            ([cfg("@hourly", "a"), "@daily b"], "not a PeriodicTaskConfig"),
            ([PeriodicTaskConfig("@daily", "b")], "Task"),  # type: ignore[arg-type]
        ]
        for round_configs, message in bad_rounds:
            configs = round_configs
            with pytest.raises((ValueError, TypeError), match=message):
                await manager.sync()
            assert manager.entries == before
        configs = good
        assert (await manager.sync()).added == []


async def test_sync_loop_applies_changes_and_survives_failures(
    redis: Redis, redis_url: str
) -> None:
    calls = 0
    state: dict[str, Any] = {"configs": [cfg("@hourly", "a")]}

    async def provider() -> list[PeriodicTaskConfig]:
        nonlocal calls
        calls += 1
        if isinstance(state["configs"], Exception):
            raise state["configs"]
        return state["configs"]  # type: ignore[no-any-return]

    # Built inside capture_logs: a manager built while structlog is unconfigured binds
    # asyncq's own fallback logger, which capture_logs cannot see (this test then passed
    # only after another test had configured structlog).
    with capture_logs() as logs:
        manager = PeriodicTaskManager(
            redis_url, provider, sync_interval=timedelta(milliseconds=100), **FAST
        )
        async with manager:
            state["configs"] = [cfg("@hourly", "a"), cfg("@daily", "b")]
            await wait_until(lambda: len(manager.entries) == 2)
            kept = manager.entries

            state["configs"] = ConnectionError("config service down")
            seen = calls
            await wait_until(lambda: calls >= seen + 2)
            state["configs"] = [cfg("bad spec", "z")]
            seen = calls
            await wait_until(lambda: calls >= seen + 2)
            assert manager.entries == kept

            state["configs"] = [cfg("@daily", "b")]
            await wait_until(lambda: len(manager.entries) == 1)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert any("config service down" in e["error"] for e in errors)
    assert any("invalid cron spec 'bad spec'" in e["error"] for e in errors)
    assert all(e["event"] == "periodic task sync failed; keeping the last good set" for e in errors)


async def test_the_first_sync_must_succeed(redis: Redis, redis_url: str) -> None:
    manager = PeriodicTaskManager(redis_url, lambda: [cfg("@every 0s", "a")])
    with pytest.raises(ValueError, match="@every interval must be at least 1s"):
        await manager.start()
    assert await redis.keys("asynq:schedulers*") == []

    def broken() -> list[PeriodicTaskConfig]:
        raise RuntimeError("no configs")

    with pytest.raises(RuntimeError, match="no configs"):
        await PeriodicTaskManager(redis_url, broken).start()
    with pytest.raises(TypeError, match="iterable"):
        await PeriodicTaskManager(redis_url, lambda: 5).start()  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="sync_interval"):
        PeriodicTaskManager(redis_url, list, sync_interval=timedelta(0))


async def test_duplicate_configs_are_registered_once(redis_url: str) -> None:
    # Built inside capture_logs: an unconfigured structlog binds the manager's logger at
    # construction, and a configuration made after it does not reach that logger.
    with capture_logs() as logs:
        manager = PeriodicTaskManager(
            redis_url, lambda: [cfg("@hourly", "a", queue="q"), cfg("@hourly", "a", queue="q")]
        )
        result = await manager.sync()
    assert len(result.added) == 1
    assert any(e["event"] == "duplicate periodic task config ignored" for e in logs)


async def test_two_managers_enqueue_each_tick_once(redis: Redis, redis_url: str) -> None:
    enqueued: list[str] = []

    def post(info: TaskInfo | None, exc: BaseException | None) -> None:
        assert info is not None, exc
        enqueued.append(info.id)

    managers = [
        PeriodicTaskManager(redis_url, lambda: [cfg("@every 1s", "ha")], post_enqueue=post, **FAST)
        for _ in range(2)
    ]
    for m in managers:
        await m.start()
    try:
        await wait_until(lambda: len(enqueued) >= 3)
    finally:
        for m in managers:
            await m.shutdown()
    assert max(Counter(enqueued).values()) == 1
    assert await redis.llen("asynq:{default}:pending") == len(enqueued)
