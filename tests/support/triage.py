"""A Redis state of mixed failures for the failure-triage tests (tests/inspection/test_triage.py
and the web UI's triage page and first view): five error signatures over two queues."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from asyncq._errsig import error_signature
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask

NOW = datetime.now(UTC).replace(microsecond=0)

REFUSED = "ConnectionError: Error 111 connecting to {}. Connection refused."
CONN = error_signature(
    "ConnectionError: Error 111 connecting to 10.0.0.1:6379. Connection refused."
)
KEYERR = error_signature("KeyError: 'user_1'")
DIAL = error_signature("dial tcp 10.1.2.3:5432: i/o timeout")
VALUE = error_signature("ValueError: order 4711 not found")


async def seed_mixed(redis: Redis, now: datetime = NOW) -> dict[str, list[GoTask]]:
    """20 failed tasks in two queues, five signatures; tasks in other states beside them.

    Times are relative to *now*: NOW for the Inspector's fixed clock, the wall clock for
    the CLI (which reads the real time).
    """

    def _at(minutes: int) -> int:
        return go.unix(now - timedelta(minutes=minutes))

    made: dict[str, list[GoTask]] = {"conn": [], "key": [], "dial": [], "value": [], "bad": []}
    for i in range(4):  # archived email tasks in default, failed 10..13 minutes ago
        t = GoTask(
            "email",
            queue="default",
            error_msg=REFUSED.format(f"10.0.0.{i}:6379"),
            last_failed_at=_at(10 + i),
        )
        await go.seed_archived(redis, t, now - timedelta(minutes=10 + i))
        made["conn"].append(t)
    for i in range(3):  # the same cause on sms tasks waiting for a retry
        t = GoTask(
            "sms",
            queue="default",
            retried=i + 1,
            error_msg=REFUSED.format(f"10.9.{i}.7:6380"),
            last_failed_at=_at(2 + i),
        )
        await go.seed_retry(redis, t, now + timedelta(minutes=5))
        made["conn"].append(t)
    for i in range(2):  # and in another queue
        t = GoTask(
            "email",
            queue="critical",
            error_msg=REFUSED.format(f"192.168.1.{i}:6379"),
            last_failed_at=_at(30 + i),
        )
        await go.seed_archived(redis, t, now - timedelta(minutes=30))
        made["conn"].append(t)
    for i in range(5):
        t = GoTask("import", error_msg=f"KeyError: 'user_{i}'", last_failed_at=_at(40 + i))
        await go.seed_archived(redis, t, now - timedelta(minutes=40))
        made["key"].append(t)
    for i in range(3):  # Go asynq's errors: no exception type
        t = GoTask(
            "report",
            queue="critical",
            error_msg=f"dial tcp 10.1.2.{i}:5432: i/o timeout",
            last_failed_at=_at(50 + i),
        )
        await go.seed_archived(redis, t, now - timedelta(minutes=50))
        made["dial"].append(t)
    for i in range(2):
        t = GoTask(
            "email",
            retried=1,
            error_msg=f"ValueError: order {4711 + i} not found",
            last_failed_at=_at(1),
            unique_key=f"asynq:{{default}}:unique:order-{i}",
        )
        await go.seed_retry(redis, t, now + timedelta(minutes=1))
        await redis.hset(t.key, "unique_key", t.unique_key)  # as asynq's unique enqueue
        await redis.set(t.unique_key, t.id)
        made["value"].append(t)
    bad = GoTask("junk")
    await redis.hset(bad.key, mapping={"msg": b"\xff\xfe not a protobuf", "state": "archived"})
    await redis.zadd("asynq:{default}:archived", {bad.id: go.unix(now)})
    made["bad"].append(bad)
    # Not failed: never counted, never touched.
    await go.enqueue(redis, GoTask("email", error_msg="ConnectionError: old"), now)
    await go.seed_completed(
        redis, GoTask("email", completed_at=go.unix(now), retention=3600, error_msg="x")
    )
    return made
