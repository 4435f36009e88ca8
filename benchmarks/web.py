"""Web UI / API / ``/metrics`` timings over many queues and tasks.

``python -m benchmarks.web`` fills a throwaway redis-server with ``--queues``
queues holding ``--tasks`` tasks in all (default 100 and 1,000,000: 60% pending,
15% scheduled, 10% retry, 10% archived, 5% completed, stored exactly as asynq
stores them), then times, through the ASGI app in-process (no network):

* ``GET /api/queues`` (the dashboard's data) and ``GET /`` (the dashboard page);
* ``GET /queues/<q>?state=pending`` (first page) and the last page of archived;
* ``GET /metrics`` (a Prometheus scrape: every queue's info).

Each is run ``--repeat`` times; the table shows median and worst in ms. The full
size needs about 1 GB of Redis memory and a few minutes to load; ``--tasks
100000`` is a quick run. Not a test: nothing asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from redis.asyncio import Redis

from asyncq.proto.asynq import TaskMessage
from asyncq.web import create_app
from benchmarks.runner import redis_server

_MIX = (("pending", 0.60), ("scheduled", 0.15), ("retry", 0.10), ("archived", 0.10),
        ("completed", 0.05))  # fmt: skip
_CHUNK = 2000


async def fill(r: Redis, queues: int, tasks: int) -> None:
    now = int(time.time())
    per_queue = tasks // queues
    for qi in range(queues):
        q = f"q{qi:03d}"
        await r.sadd("asynq:queues", q)
        prefix = f"asynq:{{{q}}}:"
        done = 0
        for state, share in _MIX:
            n = int(per_queue * share) if state != "completed" else per_queue - done
            done += n
            for start in range(0, n, _CHUNK):
                pipe = r.pipeline(transaction=False)
                for i in range(start, min(n, start + _CHUNK)):
                    tid = str(uuid.uuid4())
                    msg = TaskMessage(
                        type=f"job:{i % 7}",
                        payload=json.dumps({"user": i, "queue": q}).encode(),
                        id=tid,
                        queue=q,
                        retry=25,
                        retried=3 if state in ("retry", "archived") else 0,
                        error_msg="boom" if state in ("retry", "archived") else "",
                        timeout=1800,
                        retention=3600 if state == "completed" else 0,
                        completed_at=now if state == "completed" else 0,
                    )
                    fields: dict[str, Any] = {"msg": bytes(msg), "state": state}
                    if state == "pending":
                        fields["pending_since"] = str((now - 60) * 1_000_000_000)
                    pipe.hset(prefix + "t:" + tid, mapping=fields)
                    if state == "pending":
                        pipe.lpush(prefix + "pending", tid)
                    else:
                        score = {"scheduled": now + 3600, "retry": now + 60,
                                 "archived": now - i, "completed": now + 3600}[state]  # fmt: skip
                        pipe.zadd(prefix + state, {tid: score})
                await pipe.execute()
        await r.set(prefix + "processed", 1000 + qi)
        await r.set(prefix + "failed", qi)


async def timed(h: httpx.AsyncClient, path: str, repeat: int) -> dict[str, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        resp = await h.get(path)
        samples.append((time.perf_counter() - start) * 1000)
        if resp.status_code != 200:
            raise SystemExit(f"GET {path} answered {resp.status_code}: {resp.text[:200]}")
    return {
        "median_ms": statistics.median(samples),
        "max_ms": max(samples),
        "bytes": len(resp.content),
    }


async def run(url: str, queues: int, tasks: int, repeat: int) -> dict[str, Any]:
    r = Redis.from_url(url)
    await r.flushdb()
    t0 = time.perf_counter()
    await fill(r, queues, tasks)
    load_s = time.perf_counter() - t0
    used = (await r.info("memory"))["used_memory_human"]
    await r.aclose()
    app = create_app(url)
    per_queue = tasks // queues
    last_archived = max(1, -(-int(per_queue * 0.10) // 30))
    paths = {
        "dashboard API  GET /api/queues": "/api/queues",
        "dashboard page GET /": "/",
        "queue page     pending, page 1": "/queues/q050?state=pending",
        "queue page     archived, last page": f"/queues/q050?state=archived&page={last_archived}",
        "task API       retry, page 1": "/api/queues/q050/tasks?state=retry",
        "scrape         GET /metrics": "/metrics",
    }
    out: dict[str, Any] = {"queues": queues, "tasks": tasks, "load_seconds": load_s,
                           "redis_memory": used, "timings": {}}  # fmt: skip
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as h,
    ):
        for label, path in paths.items():
            await h.get(path)  # warm-up (connections, templates)
            out["timings"][label] = await timed(h, path, repeat)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.web", description=__doc__)
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--redis-url", help="use this Redis (its database is FLUSHED)")
    args = p.parse_args(argv)
    with redis_server(args.redis_url) as url:
        res = asyncio.run(run(url, args.queues, args.tasks, args.repeat))
    print(f"{res['queues']} queues, {res['tasks']:,} tasks, loaded in {res['load_seconds']:.1f} s,"
          f" Redis memory {res['redis_memory']}")  # fmt: skip
    for label, t in res["timings"].items():
        print(f"  {label:<56} median {t['median_ms']:8.1f} ms   max {t['max_ms']:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
