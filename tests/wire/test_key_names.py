"""Names that would break asynq's key schema ('{' or '}') are refused with nothing written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import BrokerError, Client, Inspector, Server, Task
from asyncq import _keys as keys
from asyncq.cli import main

BAD = ["foo}:pending", "default}:t:foo", "{x}", "a{b", "b}"]


async def all_keys(redis: Redis) -> set[bytes]:
    return set(await redis.keys("*"))


@pytest.mark.parametrize("name", BAD)
async def test_client_refuses_braces_and_writes_nothing(
    redis: Redis, client: Client, name: str
) -> None:
    before = await all_keys(redis)
    attempts: list[Callable[[], object]] = [
        lambda: client.enqueue(Task("t"), task_id=name),
        lambda: client.enqueue(Task("t"), queue=name),
        lambda: client.enqueue(Task("t"), group=name),
        lambda: client.enqueue(Task("t"), task_id=name, unique=timedelta(minutes=1)),
        lambda: client.enqueue(Task("t"), task_id=name, process_in=timedelta(hours=1)),
    ]
    for attempt in attempts:
        with pytest.raises(ValueError, match="braces"):
            await attempt()  # type: ignore[misc]
    results = await client.enqueue_many([(Task("t"), {"task_id": name})])
    assert isinstance(results[0], ValueError)
    assert await all_keys(redis) == before


@given(
    prefix=st.text(max_size=5),
    brace=st.sampled_from("{}"),
    suffix=st.text(max_size=5),
)
@settings(max_examples=25, deadline=None)
def test_every_name_holding_a_brace_is_refused(prefix: str, brace: str, suffix: str) -> None:
    name = prefix + brace + suffix
    for what in ("queue name", "task ID", "group"):
        with pytest.raises(ValueError, match=what):
            keys.refuse_braces(what, name)


async def test_inspector_refuses_braces(redis: Redis) -> None:
    before = await all_keys(redis)
    async with Inspector(redis) as inspector:
        for name in BAD:
            with pytest.raises(ValueError, match="braces"):
                await inspector.get_task("default", name)
            with pytest.raises(ValueError, match="braces"):
                await inspector.delete_task("default", name)
            with pytest.raises(ValueError, match="braces"):
                await inspector.queue_info(name)
            with pytest.raises(ValueError, match="braces"):
                await inspector.cancel(name)
            with pytest.raises(ValueError, match="braces"):
                await inspector.pause(name)
    assert await all_keys(redis) == before


def test_server_config_refuses_braces(redis_url: str) -> None:
    for name in BAD:
        with pytest.raises(ValueError, match="braces"):
            Server(redis_url, queues={name: 1})


def test_cli_refuses_braces_with_one_line_and_writes_nothing(
    redis_url: str, tmp_path: object
) -> None:
    import redis as sync_redis

    r = sync_redis.Redis.from_url(redis_url)
    before = set(r.keys("*"))
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})
    for args in (
        ["task", "enqueue", "-t", "t", "--id", "foo}:pending"],
        ["task", "enqueue", "-t", "t", "-q", "default}:t:foo"],
        ["task", "enqueue", "-t", "t", "-g", "{g}"],
        ["task", "inspect", "-q", "default", "-i", "foo}:pending"],
    ):
        result = runner.invoke(main, ["-u", redis_url, *args], catch_exceptions=False)
        assert result.exit_code != 0, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "braces" in lines[0], lines[0]
    assert set(r.keys("*")) == before
    r.close()


@pytest.mark.parametrize(
    ("options", "blocked_key"),
    [
        ({}, keys.pending_key("default")),
        ({"unique": timedelta(minutes=1)}, keys.pending_key("default")),
        ({"process_in": timedelta(hours=1)}, keys.scheduled_key("default")),
        (
            {"process_in": timedelta(hours=1), "unique": timedelta(minutes=1)},
            keys.scheduled_key("default"),
        ),
        ({"group": "g"}, keys.group_key("default", "g")),
        ({"group": "g", "unique": timedelta(minutes=1)}, keys.group_key("default", "g")),
    ],
)
async def test_a_refused_write_leaves_nothing_behind(
    redis: Redis, client: Client, options: dict[str, Any], blocked_key: str
) -> None:
    await redis.set(blocked_key, "not a list, set or sorted set")
    before = await all_keys(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await client.enqueue(Task("t", b"p"), task_id="orphan-check", **options)
    # No task hash, no lock: no partial write. (asynq:queues lists the queue name: a
    # separate command before the write, as in asynq.)
    assert await all_keys(redis) - {keys.ALL_QUEUES.encode()} == before
