"""The scenarios: each injects one kind of failure under load and ends with the ledger check."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis as sync_redis
from redis.crc import key_slot

from asyncq import App, Client, Connection, Inspector, Task
from chaos.harness import QUEUE, Figures, Harness, faketime_library
from chaos.ledger import Fault, read_ledger
from chaos.procs import ClusterGroup, RedisProc, SentinelGroup, redis_cli
from chaos.proxy import PartitionProxy
from chaos.worker import DURABLE, DURABLE_RESULT, SIGNAL

__all__ = ["SCENARIOS", "Size"]


@dataclass(frozen=True)
class Size:
    quick: bool

    def pick(self, full: float, quick: float) -> float:
        return quick if self.quick else full

    def count(self, full: int, quick: int) -> int:
        return quick if self.quick else full


async def _finish(h: Harness, conn: Connection, drain_within: float = 180) -> Figures:
    view = await h.drain(conn, within=drain_within)
    await h.stop_workers()
    return await h.check(conn, view)


async def crash_storm(size: Size) -> Figures:
    """3 workers; a random one SIGKILLed every 1-3 s and restarted, while tasks flow in."""
    storm = size.pick(60, 15)
    n = size.count(20_000, 2_500)
    redis = RedisProc().start()
    try:
        async with Harness("crash storm", redis.url, lease=3.0) as h, Connection(redis.url) as conn:
            for _ in range(3):
                await h.spawn(concurrency=10)
            async with Client(conn) as client:
                producer = asyncio.create_task(h.produce(client, n, seconds=storm * 0.8))
                rng = random.Random(16)
                end = time.monotonic() + storm
                while time.monotonic() < end:
                    await asyncio.sleep(rng.uniform(1, 3))
                    await h.kill(rng.choice(h.workers))
                await producer
            h.figures.notes["workers"] = 3
            return await _finish(h, conn)
    finally:
        redis.cleanup()


async def _redis_crash(size: Size, name: str, *, hard: bool) -> Figures:
    n = size.count(6_000, 1_200)
    load = size.pick(20, 8)
    redis = RedisProc("--appendonly", "yes", "--appendfsync", "everysec").start()
    try:
        async with Harness(name, redis.url, lease=3.0) as h, Connection(redis.url) as conn:
            for _ in range(2):
                await h.spawn(concurrency=10)
            async with Client(conn) as client:
                producer = asyncio.create_task(h.produce(client, n, seconds=load))
                await asyncio.sleep(load / 3)
                start = time.time()
                if hard:
                    redis.kill()
                else:
                    redis.terminate()
                await asyncio.sleep(1.0)
                redis.start()
                h.faults.append(
                    Fault("redis " + ("SIGKILL" if hard else "restart"), start, time.time())
                )
                h.figures.kills += 1
                await producer
            h.figures.notes["aof"] = "appendonly yes, appendfsync everysec"
            return await _finish(h, conn)
    finally:
        redis.cleanup()


async def redis_restart(size: Size) -> Figures:
    """Redis shut down cleanly (SIGTERM) mid-run and started again on its AOF."""
    return await _redis_crash(size, "redis restart (AOF)", hard=False)


async def redis_sigkill(size: Size) -> Figures:
    """Redis SIGKILLed mid-run (AOF everysec, no final fsync) and started again."""
    return await _redis_crash(size, "redis SIGKILL (AOF everysec)", hard=True)


async def partition(size: Size) -> Figures:
    """One worker cut off from Redis (bytes dropped, sockets open) for longer than the lease."""
    n = size.count(5_000, 1_200)
    load = size.pick(20, 10)
    cut = size.pick(10, 6)
    lease = 3.0
    redis = RedisProc().start()
    proxy = await PartitionProxy(redis.port).start()
    try:
        async with (
            Harness("network partition", redis.url, lease=lease) as h,
            Connection(redis.url) as conn,
        ):
            victim = await h.spawn(url=proxy.url, concurrency=10)
            for _ in range(2):
                await h.spawn(concurrency=10)
            async with Client(conn) as client:
                # Longer handlers: the victim holds several tasks when it is cut off.
                producer = asyncio.create_task(h.produce(client, n, seconds=load, ms=(50, 300)))
                await asyncio.sleep(load / 4)
                start = time.time()
                proxy.partition()
                await asyncio.sleep(cut)
                proxy.heal()
                healed = time.time()
                h.faults.append(Fault("partition", start, healed, victim.pid))
                h.figures.kills += 1
                await producer
            h.figures.notes["partition_s"] = cut
            h.figures.notes["lease_s"] = lease
            fig = await _finish(h, conn)
            assert h.ledger is not None
            view = await read_ledger(h.ledger)
            mine = [r for runs in view.runs.values() for r in runs if r.pid == victim.pid]
            fig.notes["victim_runs"] = len(mine)
            # It reconnected by itself and went on working after the partition healed.
            fig.notes["victim_runs_after_heal"] = sum(r.start > healed for r in mine)
            return fig
    finally:
        await proxy.close()
        redis.cleanup()


async def _runs_by_pid(h: Harness) -> dict[int, list[str]]:
    assert h.ledger is not None
    view = await read_ledger(h.ledger)
    out: dict[int, list[str]] = {}
    for tid, runs in view.runs.items():
        for r in runs:
            out.setdefault(r.pid, []).append(tid)
    return out


async def _enqueue_latency(url: str, min_replicas: int, count: int) -> dict[str, float]:
    async with Client(url, min_replicas=min_replicas) as client:
        await client.enqueue(Task("warmup"), queue="latency")
        samples = []
        for _ in range(count):
            t = time.perf_counter()
            await client.enqueue(Task("noop"), queue="latency")
            samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 3),
    }


async def sentinel_failover(size: Size) -> Figures:
    """Master SIGKILLed under load; sentinels promote a replica; everyone follows by itself;
    then a second failover, forced with the new master alive, while the tasks still flow."""
    n = size.count(6_000, 1_200)
    load = size.pick(25, 12)
    group = SentinelGroup(replicas=2, sentinels=3)
    group.start()
    logs: Path | None = None  # the harness's, kept when the scenario fails: the group's go in
    try:
        async with (
            Harness("sentinel failover", group.url, lease=4.0) as h,
            Connection(group.url) as conn,
        ):
            logs = h.logs
            # What min_replicas costs: serial enqueue latency, before any fault.
            m = group.master.url
            h.figures.notes["enqueue_latency_min_replicas_0"] = await _enqueue_latency(m, 0, 300)
            h.figures.notes["enqueue_latency_min_replicas_1"] = await _enqueue_latency(m, 1, 300)
            await conn.redis.delete("asynq:{latency}:pending")
            for _ in range(3):
                await h.spawn(concurrency=10, extra=["--min-replicas", "1"])
            watch = asyncio.create_task(_watch_failovers(group, h.faults))
            try:
                async with Client(conn, min_replicas=1, replica_timeout=timedelta(seconds=2)) as c:
                    producer = asyncio.create_task(h.produce(c, n, seconds=load))
                    await asyncio.sleep(load / 3)
                    old = group.master
                    start = time.time()
                    old.kill()
                    await _until(lambda: _promoted(group, old.port), 60, "a promotion")
                    h.figures.notes["failover_s"] = round(time.time() - start, 2)
                    # Until a replica follows the new master, min_replicas=1 cannot confirm
                    # an outcome: it is logged as unconfirmed and may run again
                    # (documented), so the fault lasts until the new master has an online
                    # replica.
                    await _until(lambda: _followed(group), 60, "a replica to follow")
                    h.faults.append(Fault("failover", start, time.time()))
                    h.figures.kills += 1
                    h.figures.notes["failover_until_replicated_s"] = round(time.time() - start, 2)
                    # A second failover while the tasks still flow, with the master alive:
                    # a retry meeting a write that reached only the demoted master must
                    # not count it as written (see docs/guarantees.md, min_replicas).
                    await asyncio.sleep(1)
                    second = group.current_master_port()
                    await _until(lambda: _force_failover(group), 30, "a forced failover")
                    await _until(lambda: _promoted(group, second), 60, "a second promotion")
                    h.figures.notes["forced_failovers"] = 1
                    await producer
                h.figures.notes["min_replicas"] = 1
                return await _finish(h, conn)
            finally:
                watch.cancel()
                h.figures.notes["master_switches"] = sum(f.kind == "switch" for f in h.faults)
    finally:
        group.cleanup(logs)


async def _watch_failovers(group: SentinelGroup, faults: list[Fault]) -> None:
    """Add every switch of master the sentinels make to *faults*, the one the scenario
    causes and any other: a master they judge down on a loaded machine is failed over
    too, and runs in flight then may run again like those of the killed master.

    A switch's fault begins when its master may have stopped answering (the sentinels'
    down-after and a second for their election before the switch was seen) and ends when
    a replica follows the new master; until then it stays open (end: infinity).
    """
    port = await asyncio.to_thread(group.current_master_port)
    while True:
        await asyncio.sleep(0.1)
        now = await asyncio.to_thread(_master_port, group)
        if now is None or now == port:
            continue
        port = now
        seen = time.time()
        open_fault = Fault("switch", seen - group.down_after - 1.0, float("inf"))
        faults.append(open_fault)
        try:
            await _until(lambda: _followed(group), 60, "a replica to follow")
        except RuntimeError:
            return  # never followed: the fault stays open, and the drain says what failed
        faults[faults.index(open_fault)] = Fault("switch", open_fault.start, time.time())


def _force_failover(group: SentinelGroup) -> bool:
    """SENTINEL FAILOVER; False while the sentinels refuse it (one still in progress, or
    no replica ready to be promoted yet)."""
    out = redis_cli(group.sentinel_ports[0], "sentinel", "failover", group.name)
    return out.strip() == "OK"


def _master_port(group: SentinelGroup) -> int | None:
    try:
        return group.current_master_port()
    except Exception:
        return None


def _promoted(group: SentinelGroup, old_port: int) -> bool:
    return _master_port(group) not in (None, old_port)


def _followed(group: SentinelGroup) -> bool:
    """The current master has a replica online (its WAIT 1 can be answered)."""
    try:
        port = group.current_master_port()
        info = sync_redis.Redis(port=port, socket_timeout=1).info("replication")
    except Exception:
        return False
    return any(
        isinstance(v, dict) and v.get("state") == "online"
        for k, v in info.items()
        if str(k).startswith("slave")
    )


async def _until(pred: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(pred):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.2)


async def cluster_failover(size: Size) -> Figures:
    """Redis Cluster: the master of the queue's slot SIGKILLed, its replica promoted."""
    n = size.count(6_000, 1_200)
    load = size.pick(25, 12)
    group = ClusterGroup(3)
    group.start()
    logs: Path | None = None  # the harness's, kept when the scenario fails: the group's go in
    try:
        async with (
            Harness("cluster failover", group.url, lease=4.0) as h,
            Connection(group.url) as conn,
        ):
            logs = h.logs
            for _ in range(3):
                await h.spawn(concurrency=10)
            async with Client(conn) as client:
                producer = asyncio.create_task(h.produce(client, n, seconds=load))
                await asyncio.sleep(load / 3)
                slot = key_slot(b"asynq:{default}:pending")
                victim = _slot_master(group, slot)
                start = time.time()
                victim.kill()
                await _until(lambda: _slot_moved(group, slot, victim.port), 60, "promotion")
                h.faults.append(Fault("cluster failover", start, time.time()))
                h.figures.kills += 1
                h.figures.notes["failover_s"] = round(time.time() - start, 2)
                await producer
            h.figures.notes["min_replicas"] = "not supported on Cluster"
            return await _finish(h, conn)
    finally:
        group.cleanup(logs)


def _slot_master(group: ClusterGroup, slot: int) -> RedisProc:
    for node in group.nodes:
        if node.proc is None or group.role(node) != "master":
            continue
        for line in redis_cli(node.port, "cluster", "nodes").splitlines():
            parts = line.split()
            if "myself" in parts[2]:
                for rng in parts[8:]:
                    lo, _, hi = rng.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return node
    raise RuntimeError(f"no master serves slot {slot}")


def _slot_moved(group: ClusterGroup, slot: int, old_port: int) -> bool:
    try:
        return _slot_master(group, slot).port != old_port
    except Exception:
        return False


async def clock_skew(size: Size) -> Figures:
    """One of three workers runs with its clock 10 s ahead."""
    n = size.count(6_000, 1_200)
    load = size.pick(20, 8)
    skew = 10.0
    lease = 15.0
    redis = RedisProc().start()
    try:
        async with (
            Harness("clock skew +10 s", redis.url, lease=lease) as h,
            Connection(redis.url) as conn,
        ):
            lib = faketime_library()
            if lib is not None:
                env = {
                    "LD_PRELOAD": lib,
                    "FAKETIME": f"+{int(skew)}s",
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "FAKETIME_DONT_RESET": "1",
                }
                extra = ["--skew", str(skew)]
                h.figures.notes["clock"] = "libfaketime (LD_PRELOAD) +10 s"
            else:
                env, extra = {}, ["--skew", str(skew), "--patch-clock"]
                h.figures.notes["clock"] = "time.time patched +10 s (libfaketime not installed)"
            skewed = await h.spawn(concurrency=10, env=env, extra=extra)
            for _ in range(2):
                await h.spawn(concurrency=10)
            async with Client(conn) as client:
                await h.produce(client, n, seconds=load)
            fig = await _finish(h, conn)
            by_pid = await _runs_by_pid(h)
            fig.notes["skewed_worker_runs"] = len(by_pid.get(skewed.pid, []))
            fig.notes["lease_s"] = lease
            return fig
    finally:
        redis.cleanup()


async def poison_pills(size: Size) -> Figures:
    """SystemExit, a loop-blocking handler and a memory hog mixed into a steady load."""
    n = size.count(6_000, 1_200)
    load = size.pick(20, 10)
    lease = 3.0
    redis = RedisProc().start()
    try:
        async with (
            Harness("poison pills", redis.url, lease=lease) as h,
            Connection(redis.url) as conn,
        ):
            for _ in range(3):
                await h.spawn(concurrency=10)
            async with Client(conn) as client:
                normal = asyncio.create_task(h.produce(client, n, seconds=load))
                pills: list[Awaitable[None]] = [
                    h.produce(client, 5, seconds=load / 2, kind="exit", payload={}, max_retry=1),
                    h.produce(
                        client,
                        2,
                        seconds=load / 2,
                        kind="block",
                        payload={"seconds": lease * 1.5},
                        max_retry=1,
                    ),
                    h.produce(
                        client, 5, seconds=load / 2, kind="memory", payload={"mb": 512}, max_retry=1
                    ),
                ]
                await asyncio.sleep(load / 4)
                await asyncio.gather(*pills)
                await normal
            return await _finish(h, conn)
    finally:
        redis.cleanup()


async def durable_runs(size: Size) -> Figures:
    """Durable runs (steps, a sleep, a signal wait, a fan-out) while one of 2 workers is
    SIGKILLed every 1-3 s: every run ends with its result, and a step or a run's last
    entry that ran twice started first in a killed worker."""
    n = size.count(2_000, 300)
    load = size.pick(40, 6)
    storm = size.pick(45, 8)
    redis = RedisProc().start()
    try:
        async with (
            Harness("durable", redis.url, lease=2.0) as h,
            Connection(redis.url) as conn,
            App(conn) as app,
        ):
            for _ in range(2):
                await h.spawn(concurrency=20)
            rng = random.Random(42)
            async with Client(conn) as client:
                producer = asyncio.create_task(
                    h.produce(client, n, seconds=load, kind=DURABLE, ms=(10, 60), retention=600)
                )
                signaller = asyncio.create_task(_signal_runs(h, app, producer, rng))
                end = time.monotonic() + storm
                while time.monotonic() < end:
                    await asyncio.sleep(rng.uniform(1, 3))
                    await h.kill(rng.choice(h.workers))
                await producer
                h.figures.notes["signals_taken_by_a_waiting_run"] = await signaller
            fig = await _finish(h, conn)
            async with Inspector(conn.redis) as inspector:
                wrong = []
                for tid in (t for t, kind in h.acked.items() if kind == DURABLE):
                    info = await inspector.get_task(QUEUE, tid)
                    if info.result != str(DURABLE_RESULT).encode():
                        wrong.append(f"{tid}: {info.state.name} {info.result!r}")
            if wrong:
                fig.error = f"{len(wrong)} run(s) without their result"
                fig.notes["wrong_results"] = wrong[:10]
            fig.notes["workers"] = 2
            return fig
    finally:
        redis.cleanup()


async def _signal_runs(
    h: Harness, app: App[Any], producer: asyncio.Task[None], rng: random.Random
) -> int:
    """Signal each run 0-2 s after its enqueue (before or while it waits); how many
    signals a waiting run took (the others were kept for the run's wait)."""
    due: dict[str, float] = {}
    took = 0
    while not producer.done() or len(due) < len(h.acked):
        now = time.monotonic()
        for tid in h.acked:
            due.setdefault(tid, now + rng.uniform(0, 2))
        for tid, at in due.items():
            if 0 < at <= now:
                took += await app.signal(SIGNAL, key=tid, payload=1, queue=QUEUE)
                due[tid] = 0
        await asyncio.sleep(0.05)
    for tid, at in due.items():
        if at > 0:
            took += await app.signal(SIGNAL, key=tid, payload=1, queue=QUEUE)
    return took


SCENARIOS: dict[str, Callable[[Size], Awaitable[Figures]]] = {
    "crash-storm": crash_storm,
    "redis-restart": redis_restart,
    "redis-sigkill": redis_sigkill,
    "partition": partition,
    "sentinel": sentinel_failover,
    "cluster": cluster_failover,
    "clock-skew": clock_skew,
    "poison": poison_pills,
    "durable": durable_runs,
}
