"""Periodic tasks with asyncq: a Scheduler, or a PeriodicTaskManager fed from a JSON file.

Run it in two or three terminals at once: every tick is still enqueued exactly
once, and stopping (or ``kill -9``-ing) one of them loses no tick::

    python examples/periodic.py                       # Scheduler, until Ctrl-C
    python examples/periodic.py --manager tasks.json  # reloads tasks.json every 10 s
    python examples/periodic.py --seconds 5           # stop after 5 s

``tasks.json`` holds a list like
``[{"cron": "@every 5s", "type": "report", "payload": {"id": 1}, "queue": "low"}]``.
Set ``ASYNCQ_REDIS_URL`` to point somewhere else than ``redis://127.0.0.1:6379/0``.
Watch the result with ``asynq cron ls`` / ``asynq cron history <entry id>`` or asynqmon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from asyncq import PeriodicTaskConfig, PeriodicTaskManager, Scheduler, Task, TaskInfo

REDIS_URL = os.environ.get("ASYNCQ_REDIS_URL", "redis://127.0.0.1:6379/0")


def on_enqueued(info: TaskInfo | None, exc: BaseException | None) -> None:
    if info is not None:
        print(f"enqueued {info.type} as {info.id} into {info.queue!r}")
    else:
        print(f"enqueue failed: {exc}")


def load_configs(path: Path) -> list[PeriodicTaskConfig]:
    """The provider: called at start and every sync interval; a bad file keeps the old set."""
    configs = []
    for item in json.loads(path.read_text()):
        options: dict[str, Any] = {}
        if "queue" in item:
            options["queue"] = item["queue"]
        if "max_retry" in item:
            options["max_retry"] = item["max_retry"]
        task = Task.from_json(item["type"], item.get("payload"))
        configs.append(PeriodicTaskConfig(item["cron"], task, options))
    return configs


async def run_scheduler(seconds: float | None) -> None:
    scheduler = Scheduler(
        REDIS_URL,
        location=ZoneInfo("Europe/Berlin"),  # cron specs below are Berlin wall-clock times
        post_enqueue=on_enqueued,
    )
    scheduler.register("@every 5s", Task("metrics:flush"), queue="low")
    scheduler.register(
        "0 9 * * mon-fri", Task.from_json("email:digest", {"list": "team"}), max_retry=3
    )
    # A CRON_TZ= prefix overrides the scheduler's zone for one entry.
    scheduler.register(
        "CRON_TZ=America/New_York 30 2 * * *",
        Task("db:backup"),
        timeout=timedelta(hours=1),
        retention=timedelta(days=1),
    )
    if seconds is None:
        await scheduler.run()  # until SIGINT / SIGTERM
        return
    async with scheduler:
        await asyncio.sleep(seconds)


async def run_manager(path: Path, seconds: float | None) -> None:
    manager = PeriodicTaskManager(
        REDIS_URL,
        lambda: load_configs(path),
        sync_interval=timedelta(seconds=10),
        post_enqueue=on_enqueued,
    )
    if seconds is None:
        await manager.run()
        return
    async with manager:
        await asyncio.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manager", type=Path, help="JSON file of periodic tasks to sync from")
    parser.add_argument("--seconds", type=float, help="stop after this many seconds")
    args = parser.parse_args()
    job = run_manager(args.manager, args.seconds) if args.manager else run_scheduler(args.seconds)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(job)


if __name__ == "__main__":
    main()
