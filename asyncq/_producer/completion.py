"""Waiting for a task's outcome: ``await client.wait(task_id, queue=...)``.

A handler's result lives where asynq keeps it: the ``result`` field of the
task hash, which stays in Redis while the task is *completed* (for its
``retention``). Waiting is woken by a completion notification rather than a
polling loop:

- asyncq workers PUBLISH the task ID on :func:`asyncq._keys.completion_channel` (one
  channel per queue, asyncq-only: Go asynq never reads it) after a task with a
  retention was marked completed, and after a task was archived;
- a waiter keeps one Pub/Sub subscription per client and queue, and re-reads
  the task hash when its ID arrives (one round trip);
- a Go asynq worker publishes nothing, and a notification can be lost (the
  subscription reconnecting); a waiter therefore also re-reads the task every
  ``poll_interval`` (1 s by default). On Redis Cluster (no Pub/Sub in
  redis-py's asyncio cluster client) waiting polls only.

The task hash is read with one HMGET; nothing is written by a waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from asyncq import _keys as keys
from asyncq._cancel import raise_if_cancelling
from asyncq._codec import decode_task_message
from asyncq._logging import get_logger
from asyncq._redis.options import RedisClient
from asyncq._taskstart import TaskOwner
from asyncq.errors import AsyncqError, TaskNotFoundError
from asyncq.task import TaskInfo, TaskState

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "ResultWaiter",
    "TaskFailedError",
]

DEFAULT_POLL_INTERVAL = timedelta(seconds=1)
"""How often a waiter re-reads the task when no notification came (Go workers, lost messages)."""

_SUBSCRIBE_WAIT = 1.0  # longest a first wait on a queue waits for its subscription

log = get_logger()


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


class TaskFailedError(AsyncqError):
    """The awaited task was archived: it failed its last retry (or skipped retries).

    ``last_error`` is the error message stored with the task; ``info`` the
    archived task's snapshot.
    """

    def __init__(self, info: TaskInfo) -> None:
        self.info = info
        self.task_id = info.id
        self.queue = info.queue
        self.last_error = info.last_error
        super().__init__(
            f"task {info.id} ({info.type}) in queue {info.queue!r} was archived after "
            f"{info.retried} retries: {info.last_error or 'no error message stored'}"
        )


class ResultWaiter:
    """Client side: waits for tasks to complete; one Pub/Sub connection for all waits."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._pubsub: Any = None if hasattr(redis, "get_nodes") else redis.pubsub()
        self._subscribed: dict[str, asyncio.Event] = {}  # channel -> confirmed
        self._waiters: dict[str, set[asyncio.Event]] = {}  # task ID -> wake-up events
        self._reader: asyncio.Task[None] | None = None
        self._tasks = TaskOwner()
        """The owner of the notification reader: :meth:`aclose` ends it."""
        self._closed = False

    async def wait(
        self,
        task_id: str,
        queue: str,
        *,
        timeout: float | None,  # noqa: ASYNC109 - also bounds the subscription wait
        poll_interval: float,
    ) -> TaskInfo:
        """The completed task's info; TaskFailedError when archived; TimeoutError on timeout."""
        if self._closed:
            raise RuntimeError("the client is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        woken = asyncio.Event()
        self._waiters.setdefault(task_id, set()).add(woken)
        try:
            await self._subscribe(queue, deadline)
            while True:
                woken.clear()  # a notification from now on makes the next wait return at once
                info = await self._read(queue, task_id)
                # A cancel landing as the read ended (3.11) still ends the wait.
                raise_if_cancelling()
                if info.state is TaskState.COMPLETED:
                    return info
                if info.state is TaskState.ARCHIVED:
                    raise TaskFailedError(info)
                pause = poll_interval
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise TimeoutError(
                            f"task {task_id} in queue {queue!r} did not complete within "
                            f"{timeout:g}s (state: {info.state.value})"
                        )
                    pause = min(pause, remaining)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await woken.wait()
        finally:
            events = self._waiters.get(task_id)
            if events is not None:
                events.discard(woken)
                if not events:
                    del self._waiters[task_id]

    async def _read(self, queue: str, task_id: str) -> TaskInfo:
        raw, state, result = await self._redis.hmget(
            keys.task_key(queue, task_id), ["msg", "state", "result"]
        )
        if raw is None or state is None:
            raise TaskNotFoundError(queue, task_id)
        msg = decode_task_message(_bytes(raw))
        text = state.decode() if isinstance(state, bytes) else str(state)
        try:
            task_state = TaskState(text)
        except ValueError:
            raise AsyncqError(f"task {task_id} has an unknown state {text!r}") from None
        stored = None if result is None else _bytes(result)
        return TaskInfo.from_message(msg, task_state, None, stored)

    async def _subscribe(self, queue: str, deadline: float | None) -> None:
        """Subscribe to the queue's channel and wait (briefly) for the confirmation."""
        if self._pubsub is None:
            return  # polling only
        channel = keys.completion_channel(queue)
        confirmed = self._subscribed.get(channel)
        if confirmed is None:
            confirmed = self._subscribed[channel] = asyncio.Event()
            try:
                await self._pubsub.subscribe(channel)
            except Exception as exc:
                del self._subscribed[channel]
                log.debug("completion channel not subscribed; polling", error=str(exc))
                return
            if self._reader is None or self._reader.done():
                self._reader = self._tasks.create_task(
                    self._read_notifications(), name="asyncq-result-waiter"
                )
        if confirmed.is_set():
            return
        limit = _SUBSCRIBE_WAIT
        if deadline is not None:
            limit = max(0.0, min(limit, deadline - asyncio.get_running_loop().time()))
        # Not confirmed in time (Redis slow or refusing): the poll still finds the outcome.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                await confirmed.wait()

    async def _read_notifications(self) -> None:
        backoff = 0.05
        while not self._closed:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
                # aclose()'s cancel may have been swallowed by the read (3.11).
                raise_if_cancelling()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The connection dropped: redis-py re-subscribes when it reconnects; until
                # the confirmations come back, waits rely on polling.
                for event in self._subscribed.values():
                    event.clear()
                log.debug("completion subscription lost; retrying", error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if message is None:
                continue
            kind = message.get("type")
            channel = message.get("channel")
            if isinstance(channel, bytes):
                channel = channel.decode()
            if kind == "subscribe":
                confirmed = self._subscribed.get(channel)
                if confirmed is not None:
                    confirmed.set()
                # A completion published before this (re)subscription was missed: every
                # waiter reads its task once more.
                for events in self._waiters.values():
                    for woken in events:
                        woken.set()
            elif kind == "message":
                data = message.get("data")
                task_id = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
                for woken in self._waiters.get(task_id, ()):
                    woken.set()

    async def aclose(self) -> None:
        self._closed = True
        try:
            await self._tasks.aclose()
        finally:
            if self._pubsub is not None:
                with contextlib.suppress(Exception):
                    await self._pubsub.aclose()
