"""Group aggregation: many small tasks become one (asynq's GroupAggregator).

Notifications for a user are enqueued into a group; the worker's aggregator
turns each ready group into one ``email:digest`` task. A group is ready when
it holds ``max_size`` tasks, when its oldest task waited ``max_delay``, or when
no task joined for ``grace_period`` (the fields of ``Aggregation``)::

    python examples/aggregation.py      # ASYNCQ_REDIS_URL overrides the Redis address

Here user 1 gets 5 notifications (aggregated at once: max size 5) and user 2
gets 2 (aggregated after the 1-second grace period).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timedelta

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import Aggregation, Client, ServeMux, Server, Task

REDIS_URL = os.environ.get("ASYNCQ_REDIS_URL", "redis://127.0.0.1:6379/0")

digests: asyncio.Queue[tuple[str, list[str]]] = asyncio.Queue()


def aggregate(group: str, tasks: Sequence[Task]) -> Task:
    """Called with the group's tasks; returns the one task to run instead.

    The tasks come in the order they joined the group to the second (within one
    second, in task-id order: see docs/aggregation.md), so they are sorted here by
    the sequence number the producer put in each payload.
    """
    lines = [t.json()["text"] for t in sorted(tasks, key=lambda t: t.json()["seq"])]
    return Task.from_json("email:digest", {"user": group, "lines": lines})


mux = ServeMux()


@mux.handler("email:digest")
async def send_digest(task: Task) -> None:
    data = task.json()
    await digests.put((data["user"], data["lines"]))


async def main() -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    server = Server(
        REDIS_URL,
        concurrency=4,
        queues={"notifications": 1},
        aggregation=Aggregation(
            aggregator=aggregate,
            max_size=5,
            grace_period=timedelta(seconds=1),
            max_delay=timedelta(seconds=30),
            check_interval=timedelta(milliseconds=250),
        ),
    )
    try:
        async with Client(REDIS_URL) as client, server:
            await client.ping()
            await server.start(mux)
            for i in range(5):
                await client.enqueue(
                    Task.from_json("notify", {"text": f"user-1 event {i}", "seq": i}),
                    queue="notifications",
                    group="user-1",
                )
            for i in range(2):
                await client.enqueue(
                    Task.from_json("notify", {"text": f"user-2 event {i}", "seq": i}),
                    queue="notifications",
                    group="user-2",
                )
            for _ in range(2):
                user, lines = await asyncio.wait_for(digests.get(), 30)
                print(f"digest for {user}: {len(lines)} notifications: {lines}")
    except (RedisConnectionError, ConnectionRefusedError) as exc:
        print(f"error: cannot connect to Redis at {REDIS_URL}: {exc}", file=sys.stderr)
        return 1
    except RedisTimeoutError as exc:
        print(f"error: Redis at {REDIS_URL} did not answer in time: {exc}", file=sys.stderr)
        return 1
    except RedisError as exc:
        print(f"error: Redis at {REDIS_URL} failed: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print("error: the digests did not arrive in time", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
