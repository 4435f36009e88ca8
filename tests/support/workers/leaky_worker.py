"""An embedded Server with structlog left unconfigured, for the log-capture test.

    python tests/support/workers/leaky_worker.py REDIS_URL

Its handlers hold a secret in a local variable and receive a secret payload;
``leaky`` fails unexpectedly, ``skip`` raises SkipRetry and ``nobody`` has no
handler. It prints "all outcomes written" once the three tasks are archived.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from redis.asyncio import Redis

from asyncq import Client, Intervals, ServeMux, Server, SkipRetry, Task
from asyncq import _keys as keys

SECRET_LOCAL = "sk-live-" + "5ec7e7"
SECRET_PAYLOAD = b"card=" + b"4111-1111"


async def main(url: str) -> None:
    mux = ServeMux()

    @mux.handler("leaky")
    async def leaky(task: Task) -> None:
        api_key = SECRET_LOCAL
        body = task.payload
        raise ValueError(f"upstream refused the request ({len(api_key)}, {len(body or b'')})")

    @mux.handler("skip")
    async def skip(task: Task) -> None:
        token = SECRET_LOCAL
        raise SkipRetry(f"not retrying ({len(token)})")

    redis = Redis.from_url(url)
    async with Client(url) as client:
        ids = [
            (await client.enqueue(Task(kind, SECRET_PAYLOAD), max_retry=0)).id
            for kind in ("leaky", "skip", "nobody")
        ]
        async with Server(
            url, concurrency=2, intervals=Intervals(task_check=timedelta(milliseconds=100))
        ) as server:
            await server.start(mux)
            # Wait for the observable outcome (a busy machine may take long), and say
            # so only once it is there.
            archived: set[str] = set()
            for _ in range(1200):
                archived = {
                    m.decode() for m in await redis.zrange(keys.archived_key("default"), 0, -1)
                }
                if set(ids) <= archived:
                    break
                await asyncio.sleep(0.1)
    await redis.aclose()
    if not set(ids) <= archived:
        sys.exit(f"not all outcomes written: {sorted(set(ids) - archived)} missing")
    print("all outcomes written", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
