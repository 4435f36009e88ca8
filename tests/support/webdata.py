"""A Redis state written the way Go asynq writes it, for the web UI, API and metrics tests.

Queues: ``critical`` (3 JSON pending, 1 binary pending), ``default`` (active,
scheduled, retry, archived x2, completed with a JSON result, a group ``user:42``
of 2 aggregating tasks), ``low`` (paused, 1 pending); daily and total counters;
one Go server running the active task; one scheduler entry with two enqueues.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask, GoWorker
from tests.support.helpers import same_day_now


@dataclass
class Seeded:
    now: datetime
    pending: list[GoTask] = field(default_factory=list)
    binary: GoTask | None = None
    active: GoTask | None = None
    scheduled: GoTask | None = None
    retry: GoTask | None = None
    archived: list[GoTask] = field(default_factory=list)
    completed: GoTask | None = None
    aggregating: list[GoTask] = field(default_factory=list)
    low: GoTask | None = None
    entry_id: str = "entry-1"
    event_ids: list[str] = field(default_factory=list)


def _json(data: object) -> bytes:
    return json.dumps(data).encode()


async def seed(r: Redis) -> Seeded:
    now = same_day_now()  # its daily counters are read back on the real clock
    s = Seeded(now=now)
    for i in range(3):
        t = GoTask("email:send", _json({"to": f"user{i}@example.com"}), queue="critical")
        await go.enqueue(r, t, now - timedelta(seconds=30 - i))
        s.pending.append(t)
    s.binary = GoTask("image:resize", b"\x00\x01\x02\xfe\xff", queue="critical")
    await go.enqueue(r, s.binary, now)

    s.active = GoTask("report:build", _json({"id": 7}), queue="default")
    await go.seed_active(r, s.active, now + timedelta(seconds=30))
    s.scheduled = GoTask("email:send", _json({"to": "later@example.com"}), queue="default")
    await go.schedule(r, s.scheduled, now + timedelta(hours=1))
    s.retry = GoTask(
        "sms:send",
        _json({"to": "+100"}),
        queue="default",
        retried=2,
        error_msg="gateway timeout",
        last_failed_at=go.unix(now - timedelta(minutes=1)),
    )
    await go.seed_retry(r, s.retry, now + timedelta(minutes=5))
    for i in range(2):
        t = GoTask(
            "sms:send",
            _json({"n": i}),
            queue="default",
            retried=25,
            error_msg="gave up",
            last_failed_at=go.unix(now - timedelta(hours=1)),
        )
        await go.seed_archived(r, t, now - timedelta(hours=1, seconds=i))
        s.archived.append(t)
    s.completed = GoTask(
        "report:build",
        _json({"id": 1}),
        queue="default",
        retention=3600,
        completed_at=go.unix(now - timedelta(minutes=2)),
    )
    await go.seed_completed(r, s.completed, result=_json({"rows": 12, "ok": True}))
    for i in range(2):
        t = GoTask("digest:add", _json({"item": i}), queue="default", group_key="user:42")
        await go.add_to_group(r, t, now)
        s.aggregating.append(t)

    s.low = GoTask("cleanup", b"", queue="low")
    await go.enqueue(r, s.low, now)
    await go.seed_paused(r, "low", now)

    await go.seed_daily(r, "default", now, processed=10, failed=2)
    await go.seed_daily(r, "default", now - timedelta(days=1), processed=7, failed=1)
    await go.seed_totals(r, "default", processed=1000, failed=50)
    await go.seed_totals(r, "critical", processed=40, failed=0)

    await go.seed_server(
        r,
        now=now,
        queues={"critical": 6, "default": 3, "low": 1},
        workers=[GoWorker(s.active, now - timedelta(seconds=5), now + timedelta(minutes=30))],
        ttl=3600,
    )
    entry = go.encode_scheduler_entry(
        entry_id=s.entry_id,
        spec="@every 1h",
        task_type="report:build",
        payload=_json({"scope": "daily"}),
        options=['Queue("default")'],
        next_at=now + timedelta(minutes=40),
        prev_at=now - timedelta(minutes=20),
    )
    await go.seed_scheduler(r, "sched-1", [entry], now, ttl=3600)
    for i in range(2):
        tid = f"cron-task-{i}"
        await go.seed_enqueue_event(r, s.entry_id, tid, now - timedelta(hours=i + 1))
        s.event_ids.append(tid)
    return s


async def seed_flow(r: Redis) -> None:
    """asyncq flow control on top of :func:`seed`: an asyncq server with type rate
    limits (``api:partner`` refused twice, ``mail`` without a bucket yet), a rate
    bucket and the ordered flag on ``critical``."""
    from asyncq import _keys as keys
    from asyncq._broker import Broker
    from asyncq._broker.typerate import take_type_tokens
    from asyncq.proto.asynq import ServerInfo

    broker = Broker(r)
    info = ServerInfo(
        host="py-host",
        pid=5151,
        server_id="py-server",
        concurrency=20,
        queues={"critical": 6, "default": 3},
        status="active",
        start_time=datetime.now(UTC) - timedelta(minutes=3),
    )
    rates = {"api:partner": "60/h", "mail": "100/s"}
    await broker.write_server_state(info, [], 3600, type_rates=rates)
    # 60/h, burst 60: the whole burst taken, two more refused; the next token in a minute.
    await take_type_tokens(
        broker, "api:partner", 62, interval_us=60_000_000, burst=60, max_wait_us=0
    )
    await r.hset(keys.rate_key("critical"), mapping={"tat": 0, "interval": 20_000, "burst": 50})
    await r.set(keys.ordered_key("critical"), "1")
