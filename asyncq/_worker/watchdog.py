"""The watchdog role: detects a blocked event loop and keeps leases alive meanwhile.

asynq's heartbeat is its own goroutine, so a busy handler never stops the
leases of the other tasks from being extended. In asyncio every role shares
one thread: an ``async def`` handler that blocks it (``time.sleep``, CPU-bound
code, a blocking client) freezes the heartbeater too, and once the leases run
out other workers recover and re-run every task of this worker.

Chosen design: a **watchdog thread**. The role's loop side ticks every
``tick`` seconds and records when it last ran. A daemon thread checks that
record; when the loop has not ticked for ``threshold`` seconds it is stalled.
While it is stalled the thread, on its own event loop and its own Redis
connection, extends the leases of the tasks this server runs (Redis and the
local lease objects alike), once per heartbeat interval, so the leases stay
alive while the process is. The thread notes which asyncio task was running
when it found the stall: the task that blocks the loop. When the loop runs
again, the role logs one WARNING naming that task and how long the loop was
blocked, and counts it in ``ServerStats.loop_stalls`` /
``ServerStats.loop_stalled_seconds``.

A bound, so that a wedged process cannot hold tasks forever: a task's lease is
only kept while its own deadline (timeout/deadline, asynq's 30 min default)
has not passed; after that the lease runs out and the recoverer elsewhere
takes the task over. Without a way to open a second connection (a Server built
on a ready redis-py Cluster or Sentinel client) stalls are still detected and
reported, but the leases are not kept.

What to do about a WARNING: blocking or CPU-bound work belongs in a plain
``def`` handler, which asyncq runs in a worker thread (``sync_concurrency``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from asyncq._broker import Broker
from asyncq._logging import error_text, task_fields
from asyncq._redis.connection import Connection
from asyncq._redis.options import RedisTarget
from asyncq._worker.active import ActiveTask, ActiveTasks
from asyncq._worker.lease import Lease, extend_leases
from asyncq._worker.roles import Role, RoleDeps

__all__ = ["Watchdog"]

_ADVICE = (
    "an async handler blocked the event loop; move blocking or CPU-bound work into a "
    "plain def handler (run in a worker thread)"
)


class Watchdog(Role):
    """Measures event-loop stalls; a thread keeps the leases alive while one lasts."""

    name: ClassVar[str] = "watchdog"

    def __init__(
        self,
        deps: RoleDeps,
        *,
        active: ActiveTasks,
        threshold: float,
        keep_leases_with: Callable[[], RedisTarget] | None,
        on_stall: Callable[[float], None],
    ) -> None:
        super().__init__(deps)
        self._on_stall = on_stall
        self.active = active
        self.threshold = threshold
        self.tick = max(0.05, min(0.5, threshold / 4))
        self._keep_leases_with = keep_leases_with
        self._last_beat = time.monotonic()
        self._culprit: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._thread_stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the loop side -------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._last_beat = time.monotonic()
        if self._thread is None:
            self._thread_stop.clear()
            self._thread = threading.Thread(
                target=self._thread_main, name="asyncq-watchdog", daemon=True
            )
            self._thread.start()
        while not self.stopping:
            before = time.monotonic()
            await self.sleep(self.tick)
            now = time.monotonic()
            self._last_beat = now
            blocked = now - before - self.tick
            if blocked >= self.threshold:
                self._report(blocked)

    def _report(self, blocked: float) -> None:
        culprit, self._culprit = self._culprit, None
        self.stats.loop_stalls += 1
        self.stats.loop_stalled_seconds += blocked
        self._on_stall(blocked)
        self.log.warning(
            "event loop blocked", blocked_for=round(blocked, 3), advice=_ADVICE,
            **(culprit or {"blocking": "unknown"}),
        )  # fmt: skip

    async def cleanup(self) -> None:
        self._thread_stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)

    # -- the thread side -----------------------------------------------------------------

    def _thread_main(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        broker: Broker | None = None
        connection: Connection | None = None
        last_kept = 0.0
        interval = self.config.heartbeat_interval
        try:
            while not self._thread_stop.is_set():
                await asyncio.sleep(self.tick)
                lag = time.monotonic() - self._last_beat
                if lag < self.threshold:
                    continue
                if self._culprit is None:
                    self._culprit = self._find_culprit()
                if self._keep_leases_with is None:
                    continue
                if time.monotonic() - last_kept < interval:
                    continue
                last_kept = time.monotonic()
                if broker is None:
                    connection = Connection(self._keep_leases_with())
                    broker = Broker(
                        connection.redis,
                        lease_duration=self.broker.lease_duration,
                        fast=connection.fast,
                    )
                await self._keep_leases(broker)
        finally:
            if connection is not None:
                try:
                    await connection.aclose()
                    if not connection.owned:  # a client copied for this thread alone
                        await connection.redis.aclose()
                except Exception as exc:
                    self.log.debug("closing the watchdog's connection failed", error=repr(exc))

    def _running(self) -> list[ActiveTask]:
        for _ in range(10):
            try:
                return list(self.active.values())
            except RuntimeError:  # changed size while copied: the loop ran meanwhile
                continue
        return []

    def _find_culprit(self) -> dict[str, Any]:
        loop = self._loop
        current = asyncio.current_task(loop) if loop is not None else None
        if current is None:
            return {"blocking": "event loop callback"}
        for act in self._running():
            if act.task is current:
                return {"blocking": "handler", **task_fields(act.msg)}
        return {"blocking": current.get_name()}

    async def _keep_leases(self, broker: Broker) -> None:
        now = time.time()
        by_queue: dict[str, list[tuple[str, Lease]]] = {}
        for act in self._running():
            # Tasks fetched but not yet started, and outcomes being written, too: the
            # stall holds them as much as the handlers (the heartbeater keeps them all).
            if act.state == "finished" or act.abandoned or now >= act.deadline:
                continue  # past its deadline a wedged task is left to the recoverer
            if act.lease.valid():
                by_queue.setdefault(act.msg.queue, []).append((act.msg.id, act.lease))
        # The same extension as the heartbeater's (the loop that runs it is blocked).
        for qname, _, exc in await extend_leases(broker, by_queue):
            self.log.warning(
                "could not keep leases during an event-loop stall",
                queue=qname, error=error_text(exc),
            )  # fmt: skip
