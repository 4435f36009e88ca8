"""``asyncq cron ls`` right after a tick lists that tick as Prev and the following one as Next
(issue 41, item 5): the scheduler rewrites its entries record at each tick, not only
at its next heartbeat."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from click.testing import CliRunner
from redis.asyncio import Redis

from asyncq import Inspector, Scheduler, Task
from asyncq._inspection.records import SchedulerEntry
from asyncq.cli import main
from tests.support.helpers import wait_until


async def test_the_listing_shows_the_tick_just_run_and_the_next(
    redis: Redis, redis_url: str
) -> None:
    # A heartbeat far longer than the test: only a tick can bring the record up to date.
    scheduler = Scheduler(redis_url, heartbeat_interval=timedelta(minutes=5))
    entry_id = scheduler.register("@every 1s", Task("cron:listed"))
    async with scheduler, Inspector(redis_url) as insp:

        async def ticked() -> SchedulerEntry | None:
            (entry,) = await insp.scheduler_entries()
            return entry if entry.prev is not None else None

        listed = await wait_until(ticked, what="a tick in the scheduler's listing")
        assert listed.id == entry_id
        assert listed.prev is not None and listed.next is not None
        assert listed.next - listed.prev == timedelta(seconds=1)

        out = await asyncio.to_thread(CliRunner().invoke, main, ["-u", redis_url, "cron", "ls"])
        assert out.exit_code == 0, out.output
        fields = dict(
            line.strip().split(":", 1) for line in out.stdout.splitlines() if line.startswith("  ")
        )
        assert fields["Prev"].strip() != "never"
        assert fields["Next"].strip() != fields["Prev"].strip()
