"""After Redis comes back, the worker says so, once (issue 41, item 12): its roles log
their failures during the outage at a bounded rate, and without this line the log
never tells that the outage ended."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from asyncq import ServeMux, Server, Task
from asyncq._producer.client import Client
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import RedisServer


async def test_the_worker_logs_once_that_it_reconnected() -> None:
    rs = RedisServer().start()
    seen: list[str] = []

    async def handle(task: Task) -> None:
        seen.append(task.id or "")

    mux = ServeMux()
    mux.handle("t", handle)
    try:
        with capture_logs() as logs:  # before the server binds its loggers
            server = Server(rs.url, **FAST)
            await server.start(mux)
            try:
                await asyncio.to_thread(rs.stop)

                def lost() -> bool:
                    return any("lost its connection" in e["event"] for e in logs)

                await wait_until(lost, what="the subscriber noticed the outage")
                assert not [e for e in logs if e["event"] == "reconnected to Redis"]
                await asyncio.to_thread(rs.start)

                def back() -> list[dict[str, object]]:
                    return [e for e in logs if e["event"] == "reconnected to Redis"]

                (line,) = await wait_until(back, within=30, what="the reconnect line")
                assert line["log_level"] == "info" and isinstance(line["down_for"], float)
                async with Client(rs.url) as client:  # it works again, and says it only once
                    info = await client.enqueue(Task("t"))
                    await wait_until(lambda: info.id in seen, within=20, what="a task after")
                assert len(back()) == 1
            finally:
                await server.shutdown()
    finally:
        rs.cleanup()
