"""OpenTelemetry tracing across the queue: W3C ``traceparent`` in task headers.

Needs the ``otel`` extra (``pip install 'asyncq[otel]'``, which brings
``opentelemetry-api``; configure an SDK and exporter in your application).

Producer side: :func:`inject` writes the current trace context into a task's
headers (``traceparent``, and ``tracestate``/``baggage`` when set) with the
globally configured propagator (W3C Trace Context by default), and
:func:`enqueue` does that inside a ``PRODUCER`` span named ``send <type>``::

    from asyncq import otel
    info = await otel.enqueue(client, Task("email:send", payload), queue="critical")

Headers travel in the task message's ``headers`` field (field 15, added in
asynq v0.26), so they survive retries and are visible to Go asynq handlers too.

Worker side: :class:`TracingMiddleware` continues the trace in a ``CONSUMER``
span named ``process <type>`` around the handler, with the attributes
``messaging.system="asyncq"``, ``messaging.message.id``,
``messaging.destination.name`` (the queue), ``asyncq.task.type`` and
``asyncq.task.retry_count``; a handler error is recorded on the span::

    mux.use(otel.TracingMiddleware())

Payloads are never put on spans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("asyncq.otel needs opentelemetry-api: pip install 'asyncq[otel]'") from exc

from typing_extensions import Unpack

from asyncq import EnqueueOptions, Handler, Task, TaskInfo

if TYPE_CHECKING:
    from asyncq import Client

__all__ = ["TracingMiddleware", "enqueue", "inject"]

_SCOPE = "asyncq"


def inject(task: Task) -> Task:
    """Write the current trace context into *task*'s headers; returns *task*."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    task.headers.update(carrier)
    return task


async def enqueue(
    client: Client,
    task: Task,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    **options: Unpack[EnqueueOptions],
) -> TaskInfo:
    """``client.enqueue(task, **options)`` in a producer span whose context the task carries."""
    tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
    with tracer.start_as_current_span(
        f"send {task.type}",
        kind=SpanKind.PRODUCER,
        attributes={"messaging.system": "asyncq", "asyncq.task.type": task.type},
    ) as span:
        inject(task)
        info = await client.enqueue(task, **options)
        span.set_attribute("messaging.message.id", info.id)
        span.set_attribute("messaging.destination.name", info.queue)
        return info


class TracingMiddleware:
    """ServeMux middleware: each handler call runs in a span continuing the producer's trace."""

    def __init__(self, *, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)

    def __call__(self, handler: Handler) -> Handler:
        tracer = self._tracer

        async def traced(task: Task) -> None:
            parent = propagate.extract(task.headers)
            attributes: dict[str, Any] = {
                "messaging.system": "asyncq",
                "messaging.operation.type": "process",
                "asyncq.task.type": task.type,
                "asyncq.task.retry_count": task.retry_count,
            }
            if task.id is not None:
                attributes["messaging.message.id"] = task.id
            if task.queue is not None:
                attributes["messaging.destination.name"] = task.queue
            if task.max_retry is not None:
                attributes["asyncq.task.max_retry"] = task.max_retry
            with tracer.start_as_current_span(
                f"process {task.type}",
                context=parent,
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    await handler(task)
                except BaseException as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, exc.__class__.__name__))
                    raise

        return traced
