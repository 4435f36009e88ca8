"""The task event stream: written by clients and servers, read by several consumers."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Client, Event, Task
from asyncq._broker import Broker
from asyncq.events import EVENTS_KEY, EventLog, QueueFilter, read_events
from tests.support import progress_app as pa
from tests.support.procs import ROOT, wait_until

READY = b"send signal TERM or INT"


async def _spawn(redis_url: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT), pa.URL_ENV: redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "asyncq.cli", "-u", redis_url, "worker",
          "tests.support.progress_app:app", "-q", "default", "-c", "4"],
        env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    async with asyncio.timeout(60):
        while READY not in await proc.stderr.readline():
            pass
    # Keep reading its log: a full pipe would block the worker.
    _DRAINS.add(asyncio.create_task(proc.stderr.read()))
    return proc


_DRAINS: set[asyncio.Task[bytes]] = set()


class Consumer:
    """Reads every event into a list, in a task of its own."""

    def __init__(self, client: Client, **filters: Any) -> None:
        self.events: list[Event] = []
        self._task = asyncio.create_task(self._read(client.events(**filters)))

    async def _read(self, stream: AsyncIterator[Event]) -> None:
        async for event in stream:
            self.events.append(event)

    def of(self, task_id: str) -> list[str]:
        return [e.kind for e in self.events if e.task_id == task_id]

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.mark.subprocess
async def test_two_consumers_see_every_event_across_a_worker_sigkill(
    redis: Redis, redis_url: str
) -> None:
    async with Client(redis_url, events=True) as client:
        first = Consumer(client)
        second = Consumer(client, kinds=["enqueued", "succeeded", "archived"])
        try:
            await _scenario(client, redis_url, first, second)
        finally:
            await first.stop()
            await second.stop()


async def _scenario(client: Client, redis_url: str, first: Consumer, second: Consumer) -> None:
    await asyncio.sleep(0.2)  # both readers have pinned their start
    doomed = await client.enqueue(Task.from_json("steps", {"n": 2, "hold": True}), max_retry=3)
    worker = await _spawn(redis_url)
    try:
        await wait_until(lambda: "progress" in first.of(doomed.id), what="doomed running")
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
    finally:
        if worker.returncode is None:
            worker.kill()
    after = [await client.enqueue(Task.from_json("steps", {"n": 0})) for _ in range(5)]
    failing = await client.enqueue(Task("failing"), max_retry=0)
    worker = await _spawn(redis_url)
    try:

        def finished() -> bool:
            return all("succeeded" in first.of(i.id) for i in after) and (
                "archived" in first.of(failing.id)
            )

        await wait_until(finished, within=30, what="the second worker's events")
    finally:
        worker.send_signal(signal.SIGTERM)
        await worker.wait()
    for info in after:
        assert first.of(info.id) == ["enqueued", "started", "progress", "succeeded"]
        assert second.of(info.id) == ["enqueued", "succeeded"]
    assert first.of(failing.id) == ["enqueued", "started", "failed", "archived"]
    failed = next(e for e in first.events if e.task_id == failing.id and e.kind == "failed")
    assert "broken on purpose" in failed.error and failed.type == "failing"
    # The killed worker's task: enqueued, started and its progress, then nothing more.
    assert first.of(doomed.id)[:3] == ["enqueued", "started", "progress"]
    assert "succeeded" not in first.of(doomed.id)
    # Each consumer read independently: the second saw its kinds of the first's events.
    kinds = {"enqueued", "succeeded", "archived"}
    assert [e.id for e in second.events] == [e.id for e in first.events if e.kind in kinds]

    # Resumed from an ID: exactly what came after it.
    middle = first.events[len(first.events) // 2]
    resumed: list[Event] = []
    async for event in client.events(since=middle.id):
        resumed.append(event)
        if event.id == first.events[-1].id:
            break
    assert resumed == first.events[len(first.events) // 2 + 1 :]


async def test_stream_length_is_bounded(redis: Redis) -> None:
    log = EventLog(Broker(redis), QueueFilter(True), max_events=200)
    for i in range(5_000):
        log.add("started", "default", "t", f"id-{i}")
        if i % 100 == 0:
            await asyncio.sleep(0)
    await log.aclose()
    # XADD MAXLEN ~ trims whole macro nodes: a little over the cap, never the 5,000 written.
    assert 200 <= await redis.xlen(EVENTS_KEY) < 400


async def test_filters_and_queue_opt_in(redis: Redis) -> None:
    log = EventLog(Broker(redis), QueueFilter(["mail*"]))
    log.add("started", "mail-eu", "send", "a")
    log.add("started", "other", "send", "b")
    log.add("succeeded", "mail-eu", "send", "a")
    await log.aclose()
    got: list[Event] = []
    async for event in read_events(redis, since="0", kinds=["succeeded"], block=0.05):
        got.append(event)
        break
    assert [(e.kind, e.task_id, e.queue) for e in got] == [("succeeded", "a", "mail-eu")]
    assert await redis.xlen(EVENTS_KEY) == 2  # the queue "other" has no events
    assert got[0].time <= datetime.now(UTC)


async def test_a_block_longer_than_the_client_s_read_timeout_waits_on(
    redis: Redis, redis_url: str
) -> None:
    """A read that blocked past the connection's read timeout failed with "Timeout reading
    from ..." (redis-py's default is 5 s): one read waits half of it at most."""

    async def reading() -> bool:
        clients = await redis.client_list()
        return any(c.get("name") == "events-reader" and c.get("cmd") == "xread" for c in clients)

    async with Redis.from_url(redis_url, socket_timeout=1, client_name="events-reader") as short:
        reader = read_events(short, block=3).__aiter__()
        first = asyncio.ensure_future(reader.__anext__())
        await wait_until(reading, what="the reader's XREAD")  # after its start was pinned
        await asyncio.sleep(2.5)  # past the 1 s timeout: the reads have waited in turn
        assert not first.done()
        log = EventLog(Broker(redis), QueueFilter(True))
        log.add("started", "default", "t", "late")
        await log.aclose()
        event = await asyncio.wait_for(first, 10)
        await reader.aclose()
    assert (event.kind, event.task_id) == ("started", "late")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="not a str"):
        QueueFilter("default")
    with pytest.raises(ValueError, match="non-blank"):
        QueueFilter([""])
    client = Client("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="event ID"):
        client.events(since="yesterday")
    with pytest.raises(ValueError, match="unknown event kinds"):
        client.events(kinds=["done"])


async def test_cli_tail_prints_events(redis: Redis, redis_url: str) -> None:
    from click.testing import CliRunner

    from asyncq.cli import main

    log = EventLog(Broker(redis), QueueFilter(True))
    log.add("started", "default", "email", "t-1")
    log.add("failed", "default", "email", "t-1", error="SMTP down")
    await log.aclose()
    args = ["-u", redis_url, "events", "tail", "--since", "0", "-n", "2"]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2
    assert "started" in lines[0] and "t-1" in lines[0]
    assert "failed" in lines[1] and lines[1].endswith("SMTP down")
