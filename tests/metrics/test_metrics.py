"""Prometheus: /metrics and the standalone exporter parsed with prometheus_client's parser
and matched against the Inspector; worker-side metrics from a real Server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from asyncq import Client, Inspector, Intervals, RevokeTask, ServeMux, Server, SkipRetry, Task
from asyncq import _keys as keys
from asyncq.metrics import ENQUEUED_STATES, MetricsExporter, WorkerMetrics
from asyncq.web import create_app
from tests.support import webdata
from tests.support.helpers import wait_until

X_METRICS = {
    "asynq_tasks_enqueued_total",
    "asynq_queue_size",
    "asynq_queue_latency_seconds",
    "asynq_queue_memory_usage_approx_bytes",
    "asynq_tasks_processed_total",
    "asynq_tasks_failed_total",
    "asynq_queue_paused_total",
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


async def check_against_inspector(text: str, redis_url: str) -> None:
    got = samples(text)
    names = {name for name, _ in got}
    assert {n for n in X_METRICS} <= names
    async with Inspector(redis_url) as insp:
        queues = await insp.queues()
        assert queues == ["critical", "default", "low"]
        for q in queues:
            info = await insp.queue_info(q)
            lq = (("queue", q),)
            for st in ENQUEUED_STATES:
                key = (
                    "asynq_tasks_enqueued_total",
                    tuple(sorted({"queue": q, "state": st}.items())),
                )
                assert got[key] == getattr(info, st), (q, st)
            assert (
                "asynq_tasks_enqueued_total",
                (("queue", q), ("state", "aggregating")),
            ) not in got
            assert got[("asynq_queue_size", lq)] == info.size
            assert got[("asynq_queue_memory_usage_approx_bytes", lq)] == info.memory_usage
            assert got[("asynq_tasks_processed_total", lq)] == info.processed_total
            assert got[("asynq_tasks_failed_total", lq)] == info.failed_total
            assert got[("asynq_queue_paused_total", lq)] == (1 if info.paused else 0)
            assert got[("asyncq_queue_running", lq)] == info.running
            assert ("asyncq_queue_concurrency_limit", lq) not in got  # none stored
            # latency grows between the scrape and this read
            latency = got[("asynq_queue_latency_seconds", lq)]
            assert latency <= info.latency.total_seconds() + 0.001
            assert latency >= info.latency.total_seconds() - 5
    assert got[("asynq_queue_paused_total", (("queue", "low"),))] == 1
    assert got[("asynq_tasks_processed_total", (("queue", "default"),))] == 1000


async def test_web_metrics_match_inspector(redis_url: str, redis: Redis) -> None:
    await webdata.seed(redis)
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
    ):
        resp = await h.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    kinds = families(resp.text)
    assert kinds["asynq_tasks_processed"] == "counter"
    assert kinds["asynq_queue_size"] == "gauge"
    await check_against_inspector(resp.text, redis_url)


async def test_standalone_exporter(redis_url: str, redis: Redis) -> None:
    await webdata.seed(redis)
    async with Inspector(redis_url) as insp:
        exporter = MetricsExporter(insp, port=0)
        port = await exporter.start()
        serving = asyncio.create_task(exporter.serve_forever())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as h:
                resp = await h.get("/metrics")
                assert (await h.get("/nope")).status_code == 404
                assert (await h.post("/metrics")).status_code == 405
        finally:
            await exporter.aclose()
            serving.cancel()
    assert resp.status_code == 200
    assert "process_cpu_seconds_total" in resp.text or "python_info" in resp.text
    await check_against_inspector(resp.text, redis_url)


async def _raw(port: int, request: bytes) -> bytes:
    """Send *request* as it is and read the exporter's whole answer (it closes after one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        if not request.endswith(b"\r\n\r\n"):
            writer.write_eof()  # a request cut short: the exporter sees the end of the stream
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_standalone_exporter_answers_malformed_requests(redis_url: str) -> None:
    """What no HTTP client sends still gets a status line naming the problem, or a clean
    close; the exporter goes on serving."""
    async with Inspector(redis_url) as insp:
        exporter = MetricsExporter(insp, port=0)
        port = await exporter.start()
        try:
            bad = await _raw(port, b"NONSENSE\r\n\r\n")
            assert bad.startswith(b"HTTP/1.1 400 Bad Request\r\n")
            assert bad.endswith(b"bad request\n")
            big = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
            assert (await _raw(port, big)).startswith(b"HTTP/1.1 431 ")
            assert await _raw(port, b"GET /metrics HTTP/1.1\r\nHost: x") == b""
            head = await _raw(port, b"HEAD / HTTP/1.1\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
            assert b"Content-Type: text/html" in head
            index = await _raw(port, b"GET /?x=1 HTTP/1.1\r\n\r\n")
            assert index.endswith(b"<a href='/metrics'>/metrics</a></body></html>")
        finally:
            await exporter.aclose()


async def test_standalone_exporter_names_an_unreachable_redis() -> None:
    async with Inspector("redis://127.0.0.1:1/0") as insp:
        exporter = MetricsExporter(insp, port=0)
        port = await exporter.start()
        try:
            answer = await _raw(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        finally:
            await exporter.aclose()
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"redis unreachable: ConnectionError" in answer


def handled(metrics: WorkerMetrics) -> float:
    """Handler runs counted so far, every outcome, queue and type together."""
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "asyncq_handler_duration_seconds_count"
    )


@pytest.fixture
async def worker_metrics() -> AsyncIterator[WorkerMetrics]:
    m = WorkerMetrics(port=0)
    yield m
    m.detach()


async def test_worker_metrics(redis_url: str, redis: Redis, worker_metrics: WorkerMetrics) -> None:
    mux = ServeMux()
    done = asyncio.Event()
    seen: list[str] = []

    @mux.handler("ok")
    async def ok(task: Task) -> None:
        seen.append("ok")

    @mux.handler("flaky")
    async def flaky(task: Task) -> None:
        seen.append("flaky")
        raise RuntimeError("boom")

    @mux.handler("fatal")
    async def fatal(task: Task) -> None:
        seen.append("fatal")
        raise SkipRetry("no")

    @mux.handler("revoke")
    async def revoke(task: Task) -> None:
        seen.append("revoke")
        raise RevokeTask("drop")

    @mux.handler("block")
    async def block(task: Task) -> None:
        time.sleep(1.5)  # noqa: ASYNC251 - blocks the loop on purpose: a stall
        seen.append("block")
        done.set()

    server = Server(
        redis_url,
        concurrency=2,
        queues={"m": 1},
        metrics=worker_metrics,
        intervals=Intervals(task_check=timedelta(milliseconds=100)),
        shutdown_timeout=timedelta(seconds=2),
    )
    await server.start(mux)
    try:
        async with Client(redis_url) as client:
            for name in ("ok", "ok", "flaky", "fatal", "revoke"):
                await client.enqueue(Task(name), queue="m", max_retry=3)
            # The five are counted before "block" stalls the loop.
            await wait_until(lambda: handled(worker_metrics) == 5, what="the first five counted")
            await client.enqueue(Task("block"), queue="m")
        async with asyncio.timeout(20):
            await done.wait()
        for _ in range(200):  # the other five ran before "block" was enqueued
            if len(seen) >= 6:
                break
            await asyncio.sleep(0.05)
        # "block" set done before returning: its outcome is counted just after.
        await wait_until(lambda: handled(worker_metrics) == 6, what="block's outcome counted")
        port = worker_metrics.bound_port
        assert port is not None
        async with httpx.AsyncClient() as h:
            text = (await h.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        await server.shutdown()
    got = samples(text)

    def count(task_type: str, outcome: str) -> float:
        key = (
            "asyncq_handler_duration_seconds_count",
            (("outcome", outcome), ("queue", "m"), ("task_type", task_type)),
        )
        return got.get(key, 0)

    assert count("ok", "success") == 2
    assert count("flaky", "failure") == 1
    assert count("fatal", "failure") == 1
    assert count("revoke", "revoked") == 1
    assert count("block", "success") == 1
    assert got[("asyncq_task_retries_total", (("queue", "m"), ("task_type", "flaky")))] == 1
    assert got[("asyncq_task_archived_total", (("queue", "m"), ("task_type", "fatal")))] == 1
    assert got[("asyncq_handlers_in_flight", (("queue", "m"),))] == 0
    assert got[("asyncq_event_loop_stalls_total", ())] >= 1
    assert worker_metrics.bound_port is None  # the HTTP server stops with the worker


def test_worker_metrics_lease_expiry_hook_and_validation() -> None:
    m = WorkerMetrics()
    m.lease_expired("q", "t")
    m.loop_stalled(0.5)
    assert (
        m.registry.get_sample_value("asyncq_lease_expiries_total", {"queue": "q", "task_type": "t"})
        == 1
    )
    assert m.registry.get_sample_value("asyncq_event_loop_stall_seconds_count") == 1
    with pytest.raises(ValueError, match="port"):
        WorkerMetrics(port=70000)


async def test_worker_metrics_count_a_lease_expiry(redis_url: str, redis: Redis) -> None:
    """A handler that blocks the loop past its own deadline: the server's watchdog keeps
    leases alive during a stall only until the task's deadline, so the lease runs out."""
    metrics = WorkerMetrics()
    mux = ServeMux()
    ran = asyncio.Event()

    @mux.handler("hog")
    async def hog(task: Task) -> None:
        # Blocks the loop (time.sleep on purpose) until the lease Redis holds has run out
        # (the local lease expires with it: the same whole second); the watchdog keeps it
        # only until the task's 1 s deadline. And at least 1.5 s: the watchdog counts a
        # stall once the loop was blocked for its 1 s threshold beyond its 0.25 s tick.
        probe = SyncRedis.from_url(redis_url)
        started = time.monotonic()
        try:
            while (
                time.monotonic() - started < 1.5
                or (expiry := probe.zscore(keys.lease_key("lease"), task.id or "")) is None
                or time.time() <= expiry
            ):
                assert time.monotonic() - started < 30, "the lease was never let run out"
                time.sleep(0.05)  # noqa: ASYNC251
        finally:
            probe.close()
        ran.set()

    server = Server(
        redis_url,
        queues={"lease": 1},
        metrics=metrics,
        lease_duration=timedelta(seconds=2),
        intervals=Intervals(
            heartbeat=timedelta(seconds=1),
            task_check=timedelta(milliseconds=100),
            # The recoverer (2 s after expiry by default) must not take the task over
            # before the check below that the processor wrote nothing.
            recoverer_cutoff=timedelta(minutes=1),
        ),
        shutdown_timeout=timedelta(seconds=1),
        # The recoverer (2 s after expiry by default) must not take the task over
        # before the check below that the processor wrote nothing.
    )
    await server.start(mux)
    try:
        async with Client(redis_url) as client:
            await client.enqueue(Task("hog"), queue="lease", timeout=timedelta(seconds=1))
        async with asyncio.timeout(30):
            await ran.wait()
        for _ in range(100):
            if metrics.registry.get_sample_value(
                "asyncq_lease_expiries_total", {"queue": "lease", "task_type": "hog"}
            ):
                break
            await asyncio.sleep(0.05)
    finally:
        await server.shutdown()
    labels = {"queue": "lease", "task_type": "hog"}
    assert metrics.registry.get_sample_value("asyncq_lease_expiries_total", labels) == 1
    assert (metrics.registry.get_sample_value("asyncq_event_loop_stalls_total") or 0) >= 1
    # its outcome was not written: the recoverer will retry it
    assert await redis.llen("asynq:{lease}:active") == 1
