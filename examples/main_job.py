"""A worker and a client in one script: enqueue 20 tasks, process them, print a summary.

Run it against a local Redis (``ASYNCQ_REDIS_URL`` overrides the address)::

    python examples/main_job.py

In production the two halves live in different processes: the client in your
application, the worker started with ``await server.run(mux)`` (or the
``asyncq worker module:app`` command), which handles SIGTERM/SIGINT/SIGTSTP.
Go asynq servers and the ``asynq`` CLI work on the same queues.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections import Counter
from datetime import timedelta

import structlog
from redis.exceptions import RedisError

from asyncq import Client, Inspector, ServeMux, Server, Task

REDIS_URL = os.environ.get("ASYNCQ_REDIS_URL", "redis://127.0.0.1:6379/0")
TOTAL = 20

mux = ServeMux()
processed: Counter[str] = Counter()
all_done = asyncio.Event()


def _count(task_type: str) -> None:
    processed[task_type] += 1
    if processed.total() == TOTAL:
        all_done.set()


@mux.handler("email:welcome")
async def send_welcome_email(task: Task) -> None:
    user = task.json()
    await asyncio.sleep(0.01)  # talk to the mail provider here
    print(f"  welcome email sent to {user['email']} (task {task.id}, queue {task.queue})")
    _count(task.type)


@mux.handler("image:resize")
async def resize_image(task: Task) -> None:
    job = task.json()
    await asyncio.sleep(0.02)  # resize here
    url = f"https://cdn.example.com/{job['image']}-{job['width']}.jpg"
    assert task.result_writer is not None
    await task.result_writer.write(url.encode())  # kept for the task's retention period
    _count(task.type)


async def main() -> int:
    # Keep the output readable: info and above only (per-task events are debug).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    async with Client(REDIS_URL) as client:
        try:
            await client.ping()
        except (RedisError, OSError) as exc:
            print(f"error: cannot reach Redis at {REDIS_URL}: {exc}", file=sys.stderr)
            print("start one (redis-server) or set ASYNCQ_REDIS_URL", file=sys.stderr)
            return 1

        server = Server(
            REDIS_URL,
            concurrency=8,
            queues={"critical": 6, "default": 3, "low": 1},
            shutdown_timeout=timedelta(seconds=5),
        )
        async with server:
            await server.start(mux)
            resize_ids = []
            for i in range(TOTAL // 2):
                await client.enqueue(
                    Task.from_json("email:welcome", {"email": f"user{i}@example.com"}),
                    queue="critical" if i % 3 == 0 else "default",
                )
                info = await client.enqueue(
                    Task.from_json("image:resize", {"image": f"photo{i}", "width": 320}),
                    queue="low",
                    retention=timedelta(minutes=10),
                )
                resize_ids.append(info.id)
            try:
                await asyncio.wait_for(all_done.wait(), 60)
            except TimeoutError:
                print(f"error: only {processed.total()} of {TOTAL} tasks done", file=sys.stderr)
                return 1

        async with Inspector(REDIS_URL) as inspector:
            info = await inspector.get_task("low", resize_ids[0])
        print(f"processed {processed.total()} tasks: {dict(processed)}")
        print(f"first resize result: {info.result.decode() if info.result else None!r}")
        print(f"server stats: succeeded={server.stats.succeeded} failed={server.stats.failed}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
