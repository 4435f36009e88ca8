"""Issue 39 item 5 (and issue 41 item 12): a progress message UTF-8 cannot encode, and
``asyncq stats`` for a Redis user without INFO and for the server's own name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result
from redis.asyncio import Redis

import asyncq
from asyncq import Client, Inspector, Task
from asyncq.cli import main
from asyncq.mux import ServeMux
from asyncq.task import TaskProgress
from tests.support.acl import temporary_acl_user
from tests.support.helpers import wait_until


async def test_progress_refuses_a_lone_surrogate_where_it_is_given(
    redis: Redis, client: Client, serve: Any
) -> None:
    refused: list[str] = []
    read = asyncio.Event()

    async def handler(task: Task) -> None:
        try:
            asyncq.progress(0.3, "rows \udcff 3/10")
        except ValueError as exc:
            refused.append(str(exc))
        asyncq.progress(0.5, "rows 5/10")
        # Still running while the test reads it: a succeeded task reads as 100 %.
        await read.wait()

    mux = ServeMux()
    mux.handle("t", handler)
    await serve(mux)
    async with Inspector(redis) as insp:
        info = await client.enqueue(Task("t", b""), retention=timedelta(seconds=60))

        async def stored() -> TaskProgress | None:
            return (await insp.get_task("default", info.id)).progress

        progress = await wait_until(stored, what="the progress the handler wrote")
        read.set()
    assert refused == [
        "progress message holds '\\udcff' at index 5: lone surrogates, which UTF-8 cannot "
        "encode; decode the text with errors='replace', or pass repr() of it"
    ]
    # The handler went on: the value it could write is there, nothing was dropped unseen.
    assert (progress.fraction, progress.message) == (0.5, "rows 5/10")


def _cli(url: str, *args: str) -> Result:
    return CliRunner(env={"COLUMNS": "100"}).invoke(main, ["-u", url, *args])


@pytest.fixture
async def no_info_user(redis: Redis, redis_url: str) -> AsyncIterator[str]:
    """An ACL user that may use every key and command but INFO."""
    async with temporary_acl_user(redis, redis_url, "noinfo", "~*", "&*", "+@all", "-info") as url:
        yield url


async def test_stats_without_info_shows_the_counts_and_names_what_it_could_not_read(
    redis: Redis, client: Client, no_info_user: str
) -> None:
    await client.enqueue(Task("t", b""), queue="mail")
    # A fresh Redis: the inspection scripts are loaded by this very user.
    await redis.script_flush()
    result = await asyncio.to_thread(_cli, no_info_user, "stats")
    assert result.exit_code == 0, result.output
    assert "Task Count by Queue" in result.stdout and "mail" in result.stdout
    assert "Redis Info" not in result.stdout
    assert "Redis refused the INFO command" in result.stderr
    as_json = await asyncio.to_thread(_cli, no_info_user, "stats", "--json")
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["by_queue"] == {"mail": 1} and data["redis"] is None


async def test_stats_shows_the_servers_own_name_and_version(redis: Redis, redis_url: str) -> None:
    server = await redis.info("server")
    name, version = (
        ("Valkey", server["valkey_version"])
        if "valkey_version" in server
        else ("Redis", server["redis_version"])
    )
    data = json.loads((await asyncio.to_thread(_cli, redis_url, "stats", "--json")).stdout)
    assert (data["redis"]["server"], data["redis"]["version"]) == (name, version)
    text = (await asyncio.to_thread(_cli, redis_url, "stats")).stdout
    header, _rule, row = text.split("Redis Info\n", 1)[1].splitlines()[:3]
    assert header.split()[:2] == ["server", "version"] and row.split()[:2] == [name, version]
