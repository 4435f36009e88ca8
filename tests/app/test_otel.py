"""OpenTelemetry: the producer's trace continues in the worker's span (in-memory exporter)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from redis.asyncio import Redis

from asyncq import Client, Inspector, Intervals, ServeMux, Server, Task, otel


@pytest.fixture
def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_trace_crosses_the_queue(
    redis_url: str, redis: Redis, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracing
    mux = ServeMux()
    mux.use(otel.TracingMiddleware(tracer_provider=provider))
    finished = asyncio.Event()
    attempts: list[int] = []

    @mux.handler("trace:me")
    async def handle(task: Task) -> None:
        attempts.append(task.retry_count)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        finished.set()

    tracer = provider.get_tracer("test")
    async with Client(redis_url) as client:
        with tracer.start_as_current_span("request") as root:
            info = await otel.enqueue(
                client, Task("trace:me", b"secret-payload"), tracer_provider=provider,
                queue="traced", max_retry=2,
            )  # fmt: skip
        trace_id = root.get_span_context().trace_id
    stored = await Inspector(redis).get_task("traced", info.id)
    assert stored.headers["traceparent"].split("-")[1] == f"{trace_id:032x}"

    server = Server(
        redis,
        queues={"traced": 1},
        retry_delay=lambda n, exc, task: timedelta(0),
        intervals=Intervals(
            task_check=timedelta(milliseconds=100), delayed_task_check=timedelta(milliseconds=200)
        ),
        shutdown_timeout=timedelta(seconds=2),
    )
    await server.start(mux)
    try:
        async with asyncio.timeout(30):
            await finished.wait()
    finally:
        await server.shutdown()

    spans = exporter.get_finished_spans()
    producer = [s for s in spans if s.kind is SpanKind.PRODUCER]
    consumers = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert len(producer) == 1 and producer[0].name == "send trace:me"
    assert producer[0].attributes["messaging.message.id"] == info.id
    assert len(consumers) == 2
    for span in consumers:
        assert span.name == "process trace:me"
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == producer[0].context.span_id
        assert span.attributes["messaging.message.id"] == info.id
        assert span.attributes["messaging.destination.name"] == "traced"
        assert span.attributes["asyncq.task.type"] == "trace:me"
        assert "secret-payload" not in str(dict(span.attributes))
    by_retry = {s.attributes["asyncq.task.retry_count"]: s for s in consumers}
    assert set(by_retry) == {0, 1}
    assert by_retry[0].status.status_code is StatusCode.ERROR
    assert by_retry[0].events[0].name == "exception"
    assert by_retry[1].status.status_code is StatusCode.UNSET


def test_inject_without_a_span_adds_nothing() -> None:
    task = otel.inject(Task("t", headers={"a": "b"}))
    assert task.headers == {"a": "b"}
