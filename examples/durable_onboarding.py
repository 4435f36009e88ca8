"""A durable function: an onboarding drip that waits for a signal, sleeps and fans out.

Two users sign up. Each run sends a welcome email (a step: an ordinary task run by any
worker), then waits for the ``email:opened`` signal for that user. User 1 opens the
email (the script sends the signal); user 2 does not, so the wait times out, the run
sleeps and sends a reminder. Both then score ten items in parallel (a fan-out of ten
steps) and return. While a run waits or sleeps it holds no worker slot: it is a
scheduled task in Redis. The durations are seconds here; in production they would be
days, and nothing else would change::

    python examples/durable_onboarding.py

Which Redis: ``ASYNCQ_REDIS_URL`` when set; else the Redis on 127.0.0.1:6379 when one
answers; else a throwaway server started for this run (see examples/main_job.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import App, Intervals, Run
from asyncq.devserver import ServerNotFoundError, example_redis

QUEUE = "durable-example"
WAIT = timedelta(seconds=2)  # days, in production
PAUSE = timedelta(seconds=1)

app = App()
outbox: list[str] = []


@app.task(name="onboarding:send_welcome", queue=QUEUE)
async def send_welcome(user_id: int) -> str:
    outbox.append(f"welcome email to user {user_id}")
    return f"welcome-{user_id}"


@app.task(name="onboarding:send_reminder", queue=QUEUE)
async def send_reminder(user_id: int) -> str:
    outbox.append(f"reminder email to user {user_id}")
    return f"reminder-{user_id}"


@app.task(name="onboarding:score", queue=QUEUE)
async def score(user_id: int, item: int) -> int:
    return user_id * item


@app.durable(name="onboarding:onboard", queue=QUEUE)
async def onboard(run: Run, user_id: int) -> str:
    # Replayed from the top after a wait (or resumed where it waited, on the worker that
    # kept it): each step returns its recorded result without running again, so the
    # welcome email goes out once.
    await run.step(send_welcome, user_id)
    opened = await run.wait_for("email:opened", key=str(user_id), timeout=WAIT)
    if opened is None:
        await run.sleep(PAUSE)  # no worker is held while it sleeps
        await run.step(send_reminder, user_id)
    scores = await run.gather(*(run.step(score, user_id, i) for i in range(10)))
    return f"user {user_id}: opened={opened is not None}, score {sum(scores)}"


async def main(redis_url: str) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    app.redis = redis_url
    try:
        await app.client.ping()
    except (RedisConnectionError, ConnectionRefusedError) as exc:
        print(f"error: cannot connect to Redis at {redis_url}: {exc}", file=sys.stderr)
        return 1
    except RedisTimeoutError as exc:
        print(f"error: Redis at {redis_url} did not answer in time: {exc}", file=sys.stderr)
        return 1
    server = app.server(
        queues={QUEUE: 1},
        concurrency=4,
        shutdown_timeout=timedelta(seconds=5),
        intervals=Intervals(delayed_task_check=timedelta(milliseconds=200)),
    )
    async with server:
        await server.start(app.mux)
        first = await onboard.start(1)
        second = await onboard.start(2)
        await asyncio.sleep(0.5)  # user 1 opens the welcome email a little later
        took = await app.signal("email:opened", key="1", payload={"at": "2026-01-05T10:00"})
        # delivered to the waiting run, or kept until it waits (App.signal's keep=)
        print(f"user 1 opened the email: signal {'delivered' if took else 'kept'}")
        for handle in (first, second):
            print(await handle.result(timeout=30))
        await server.shutdown()
    await app.aclose()
    print("\n".join(outbox))
    return 0


def run() -> int:
    try:
        with example_redis() as url:
            return asyncio.run(main(url))
    except ServerNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run())
