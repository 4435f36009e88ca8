"""Worker-side Prometheus metrics: what only a running worker knows.

``Server(metrics=WorkerMetrics(port=9877))`` exposes, in its own registry:

* ``asyncq_handler_duration_seconds`` (histogram; task_type, queue, outcome):
  handler run time, outcome ``success``, ``failure``, ``revoked``, ``canceled``
  (deadline, cancel message, lease expiry or shutdown) or ``suspended`` (a durable
  run's attempt that ended waiting);
* ``asyncq_handlers_in_flight`` (gauge; queue): handlers running now;
* ``asyncq_task_retries_total`` / ``asyncq_task_archived_total`` (counters;
  task_type, queue): failures scheduled for a retry / archived;
* ``asyncq_lease_expiries_total`` (counter; task_type, queue);
* ``asyncq_event_loop_stalls_total`` (counter) and
  ``asyncq_event_loop_stall_seconds`` (histogram): times the server's watchdog
  found the event loop blocked (0.5-1 s, see the server's watchdog role), with
  how long each lasted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from asyncq._broker.durable import RunSuspended
from asyncq.errors import RevokeTask
from asyncq.mux import Handler
from asyncq.task import Task

__all__ = ["DEFAULT_BUCKETS", "WorkerMetrics"]

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
_STALL_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def _revoked(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, RevokeTask):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class WorkerMetrics:
    """Prometheus metrics of one worker server (see the module docs for the names).

    *registry*: where the metrics live (a new ``CollectorRegistry`` by default;
    pass ``prometheus_client.REGISTRY`` to share the process-wide one). *port*:
    serve ``/metrics`` on *host*:*port* while the server runs (no HTTP server when
    None; mount the registry in your own app instead).
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        namespace: str = "asyncq",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(f"port must be 0..65535, got {port}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.port = port
        self.host = host
        ns = namespace
        self.duration = Histogram(
            "handler_duration_seconds",
            "Handler run time by task type, queue and outcome.",
            ["task_type", "queue", "outcome"],
            namespace=ns,
            buckets=tuple(buckets),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "handlers_in_flight",
            "Handlers running now.",
            ["queue"],
            namespace=ns,
            registry=self.registry,
        )
        self.retries = Counter(
            "task_retries",
            "Failed tasks scheduled for another attempt.",
            ["task_type", "queue"],
            namespace=ns,
            registry=self.registry,
        )
        self.archived = Counter(
            "task_archived",
            "Failed tasks archived (out of retries or SkipRetry).",
            ["task_type", "queue"],
            namespace=ns,
            registry=self.registry,
        )
        self.lease_expiries = Counter(
            "lease_expiries",
            "Tasks whose lease expired while this worker ran them.",
            ["task_type", "queue"],
            namespace=ns,
            registry=self.registry,
        )
        self.stalls = Counter(
            "event_loop_stalls",
            "Times the event loop was blocked longer than the stall threshold.",
            namespace=ns,
            registry=self.registry,
        )
        self.stall_seconds = Histogram(
            "event_loop_stall_seconds",
            "How long the event loop was blocked, for each stall.",
            namespace=ns,
            buckets=_STALL_BUCKETS,
            registry=self.registry,
        )
        self._http: Any = None
        self._http_thread: threading.Thread | None = None

    # -- WorkerHooks ---------------------------------------------------------------------

    def instrument(self, handler: Handler) -> Handler:
        duration = self.duration
        in_flight = self.in_flight

        async def observed(task: Task) -> None:
            queue = task.queue or ""
            gauge = in_flight.labels(queue)
            gauge.inc()
            start = time.perf_counter()
            outcome = "failure"
            try:
                await handler(task)
                outcome = "success"
            except asyncio.CancelledError:
                outcome = "canceled"
                raise
            except RunSuspended:  # a durable run's attempt ended waiting: no failure
                outcome = "suspended"
                raise
            except BaseException as exc:
                outcome = "revoked" if _revoked(exc) else "failure"
                raise
            finally:
                gauge.dec()
                duration.labels(task.type, queue, outcome).observe(time.perf_counter() - start)

        return observed

    def attach(self) -> None:
        if self.port is not None and self._http is None:
            self._http, self._http_thread = start_http_server(
                self.port, self.host, registry=self.registry
            )

    def detach(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            if self._http_thread is not None:
                self._http_thread.join(timeout=5)
            self._http = self._http_thread = None

    @property
    def bound_port(self) -> int | None:
        """The port the HTTP server listens on while attached (useful with ``port=0``)."""
        if self._http is None:
            return None
        return int(self._http.server_port)

    def task_retried(self, queue: str, task_type: str) -> None:
        self.retries.labels(task_type, queue).inc()

    def task_archived(self, queue: str, task_type: str) -> None:
        self.archived.labels(task_type, queue).inc()

    def lease_expired(self, queue: str, task_type: str) -> None:
        self.lease_expiries.labels(task_type, queue).inc()

    def loop_stalled(self, seconds: float) -> None:
        self.stalls.inc()
        self.stall_seconds.observe(seconds)

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        return None  # counted by instrument() and the retried/archived hooks
