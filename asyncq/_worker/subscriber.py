"""The subscriber role: one Pub/Sub connection for cancellations and wake-ups.

It subscribes to asynq's ``asynq:cancel`` channel (a message is a task ID;
the running handler of that task is cancelled, which counts as a failure, so
the task is retried, as in asynq; an ID after :data:`asyncq._keys.STOP_MARK`
cancels it with :class:`~asyncq.TaskStoppedError`, which archives it) and to
asyncq's wake-up channel of every served queue (``asyncq:wakeup:{<queue>}``,
published by asyncq's enqueue scripts when a pending list goes from empty to
non-empty), which ends the processor's idle wait at once. When the served
queues change (patterns, see :mod:`asyncq._worker.queueset`) the channels
follow within a second.

Where direct delivery is possible (not on Redis Cluster) it also subscribes to
the server's own delivery channel (``asyncq:delivery:<server id>``): an asyncq
enqueue publishes there a task it wrote active for this server, which the
processor starts without a fetch (see :mod:`asyncq._broker.delivery`). On the
lean connection of a single server the note goes to the processor as the socket
is read (:meth:`~asyncq._redis.pubsub.FastPubSub.route`), not through this
role's loop: the task starts one turn of the event loop sooner.

The cancel channel is subscribed first, on its own. When Redis ACLs deny the
wake-up channels (a user granted only ``&asynq:cancel``, which is all Go asynq
needs), one warning is logged and the server runs with cancellation only: the
processor then finds new work by polling every ``task_check_interval``. The
wake-ups are asked for again on every new connection.

On a single Redis server the same connection first turns on key tracking for
the served queues' pending lists and paused flags and subscribes
``__redis__:invalidate``, so that tasks written by Go asynq or anyone else
wake the processor too (see :mod:`asyncq._worker.wakeup`). Redis cannot add
or drop tracked prefixes on a subscribed RESP2 connection, so when the served
queues change the connection is replaced.

The connection is re-established with a backoff of 0.1 s doubling up to 2 s
(asynq waits 5 s) while Redis is unreachable; after a reconnect the processor
is woken once, since a wake-up may have been missed meanwhile, and one line
(``reconnected to Redis``, with ``down_for`` in seconds) tells the log that
the outage is over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from asyncq import _keys as keys
from asyncq._logging import Backoff, error_text, is_debug_enabled, task_fields
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._redis.pubsub import FastPubSub, FastPubSubClient
from asyncq._worker.active import ActiveTasks
from asyncq._worker.roles import Role, RoleDeps
from asyncq._worker.wakeup import INVALIDATE_CHANNEL, QueueWakeup, tracked_prefixes
from asyncq.errors import TaskCanceledError, TaskStoppedError

__all__ = ["Subscriber"]

_POLL = 1.0  # seconds per blocking read; a local timer only, Redis sees nothing


class Subscriber(Role):
    """Listens on the cancel channel and the queues' wake-up channels."""

    name: ClassVar[str] = "subscriber"
    # Started after its first attempt to subscribe, so that a task enqueued right after
    # the server's start() wakes it; with Redis down, after the first failed attempt
    # (it keeps retrying in the background).
    reports_started: ClassVar[bool] = True

    def __init__(
        self,
        deps: RoleDeps,
        *,
        active: ActiveTasks,
        wakeup: QueueWakeup,
        pubsub: Callable[[], Awaitable[Redis | FastPubSubClient]],
        delivery: tuple[str, Callable[[bytes], None]] | None = None,
    ) -> None:
        super().__init__(deps)
        self._delivery_channel = delivery[0].encode() if delivery else b""
        self._on_delivery = delivery[1] if delivery else None
        self.active = active
        self._wakeup = wakeup
        self._pubsub = pubsub
        self.ready = asyncio.Event()
        """Set once the subscriptions are confirmed by Redis."""
        self._task: asyncio.Task[Any] | None = None
        self._reading = False
        self._wakeups = self._channels()
        self._seen_version = self.queues.version
        self._denied = False
        self._warned_denied = False
        self._warned_untracked = False
        self._trackable = False
        """Whether a new connection would track the queues (a single server, not refused)."""

    def _channels(self) -> dict[bytes, str]:
        """The wake-up channel of every queue served now."""
        self._seen_version = self.queues.version
        return {keys.wakeup_channel(q).encode(): q for q in self.queues.names()}

    async def _follow_queues(self, pubsub: Any) -> None:
        """Queues matching the server's patterns came or went: (un)subscribe their channels.

        The confirmations are read (and ignored) by the reading loop; a refusal
        surfaces there as a Redis error, and the reconnect then handles it.
        """
        old = self._wakeups
        self._wakeups = new = self._channels()
        if self._denied:
            return
        added = [c for c in new if c not in old]
        removed = [c for c in old if c not in new]
        if added:
            await pubsub.subscribe(*added)
        if removed:
            await pubsub.unsubscribe(*removed)

    def request_stop(self) -> None:
        super().request_stop()
        if self._reading and self._task is not None:
            self._task.cancel()  # interrupt the blocking read; nothing is lost by it

    async def run(self) -> None:
        await self._run()
        self.started()  # stopped before an attempt (a burst run may end first): none is coming

    async def _run(self) -> None:
        self._task = asyncio.current_task()
        backoff = Backoff(0.1, 2.0)
        connected_before = False
        # When the connection was lost (monotonic seconds): the next subscription says,
        # once, that Redis is back. The other roles only log their failures, at a bounded
        # rate, so without this line an operator cannot tell from the log that it ended.
        lost_at: float | None = None
        cancel_channel = keys.CANCEL_CHANNEL.encode()
        while not self.stopping:
            pubsub: Any = None
            try:
                client = await self._pubsub()
                pubsub = client.pubsub()
                if self._on_delivery is not None and isinstance(pubsub, FastPubSub):
                    pubsub.route(self._delivery_channel, self._delivered)
                tracked = await self._track(pubsub)
                # Cancel first and on its own: a Redis user granted only asynq:cancel
                # (all Go asynq needs) must still get cancellation.
                if not await self._subscribe(pubsub, [cancel_channel], cancel_channel):
                    return
                channels = 1
                self._denied = False
                wanted = list(self._wakeups)
                if tracked:
                    wanted.append(INVALIDATE_CHANNEL)
                if self._on_delivery is not None:
                    wanted.append(self._delivery_channel)
                if wanted:
                    try:
                        if not await self._subscribe(pubsub, wanted, cancel_channel):
                            return
                        channels += len(wanted)
                    except NoPermissionError as exc:
                        self._wakeups_denied(pubsub, exc)
                        tracked = False
                self._wakeup.tracking = tracked
                self._wakeup.delivery = self._on_delivery is not None and not self._denied
                if self._wakeup.delivery:
                    self._wakeup.set()  # the processor may ask for delivery now, not next poll
                self.ready.set()
                self.started()
                backoff.reset()
                if connected_before:
                    self._wakeup.set()
                connected_before = True
                if lost_at is not None:
                    self.log.info(
                        "reconnected to Redis", down_for=round(time.monotonic() - lost_at, 1)
                    )
                    lost_at = None
                if is_debug_enabled(self.log):
                    self.log.debug("subscribed", channels=channels)
                while not self.stopping:
                    self._reading = True
                    try:
                        msg = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=_POLL
                        )
                    finally:
                        self._reading = False
                    self._handle(msg, cancel_channel)
                    if self.queues.version != self._seen_version:
                        if self._trackable:
                            break  # a new connection tracks the new set of queues
                        await self._follow_queues(pubsub)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self.stopping and current is not None:
                    current.uncancel()
                    return
                raise
            except REDIS_ERRORS as exc:
                self._wakeup.tracking_lost()
                self.started()
                if lost_at is None and connected_before:
                    lost_at = time.monotonic()
                self.redis_error("subscriber lost its connection; reconnecting", exc)
                await self.sleep(backoff.next_delay())
            finally:
                self._wakeup.tracking_lost()
                if pubsub is not None:
                    try:
                        await pubsub.aclose()
                    except Exception as exc:  # the connection may be gone already
                        if is_debug_enabled(self.log):
                            self.log.debug("closing the pubsub failed", error=repr(exc))

    async def _track(self, pubsub: Any) -> bool:
        """Turn on key tracking of the served queues on *pubsub*'s connection; False
        (logged once) where it is not used or refused. Connection errors are raised."""
        self._wakeups = self._channels()
        self._trackable = isinstance(pubsub, FastPubSub)
        if not isinstance(pubsub, FastPubSub):
            self._untracked("key tracking is used on a single Redis server only (not on a "
                            "cluster or through Sentinel)", None)  # fmt: skip
            return False
        if not self._wakeups:
            return False  # only patterns, matching nothing yet
        try:
            await pubsub.track(tracked_prefixes(self._wakeups.values()))
        except ResponseError as exc:  # a server before 6.0, a proxy or an ACL refusing CLIENT
            self._trackable = False
            self._untracked("Redis refuses key tracking", exc)
            return False
        return True

    def _untracked(self, why: str, exc: ResponseError | None) -> None:
        interval = self.config.task_check_interval
        if self._warned_untracked:
            if is_debug_enabled(self.log):
                self.log.debug("key tracking still unavailable", reason=why)
            return
        self._warned_untracked = True
        fields: dict[str, Any] = {"task_check_interval": interval}
        if exc is not None:
            fields["error"] = error_text(exc)
        log = self.log.warning if exc is not None else self.log.info
        log(f"{why}; tasks written without a wake-up message (Go asynq) are found by "
            "polling the queues", **fields)  # fmt: skip

    async def _subscribe(self, pubsub: Any, channels: list[bytes], cancel_channel: bytes) -> bool:
        """SUBSCRIBE *channels* and wait for Redis to confirm each; False when stopping.

        Messages arriving meanwhile (on channels subscribed earlier) are
        dispatched, not dropped. A refusal (e.g. NoPermissionError) is raised.
        """
        await pubsub.subscribe(*channels)
        confirmed = 0
        while confirmed < len(channels):
            msg = await pubsub.get_message(timeout=_POLL)
            if msg is not None and msg.get("type") in ("subscribe", b"subscribe"):
                confirmed += 1
            else:
                self._handle(msg, cancel_channel)
            if self.stopping:
                return False
        return True

    def _wakeups_denied(self, pubsub: Any, exc: NoPermissionError) -> None:
        # Redis refused the whole SUBSCRIBE, so none of them is subscribed; forget them,
        # or redis-py would ask for them again, together with cancel, on a reconnect.
        self._denied = True
        for channel in (*self._wakeups, INVALIDATE_CHANNEL, self._delivery_channel):
            pubsub.channels.pop(channel, None)
        interval = self.config.task_check_interval
        if self._warned_denied:
            if is_debug_enabled(self.log):
                self.log.debug("wake-up channels still denied by Redis", error=error_text(exc))
            return
        self._warned_denied = True
        self.log.warning(
            "Redis denies the wake-up channels to this user (ACL); wake-ups disabled, "
            "polling the queues instead",
            task_check_interval=interval,
            error=error_text(exc),
        )

    def _delivered(self, note: bytes) -> None:
        """A delivery note, handed over as the connection reads it (the route above) or
        from this role's loop (a connection through redis-py)."""
        assert self._on_delivery is not None  # routed only with a delivery channel
        try:
            self._on_delivery(note)
        except Exception as bug:  # never the connection's to die of: the lease recovers it
            self.log.error("delivered task could not be started", exc_info=bug)

    def _handle(self, msg: dict[str, Any] | None, cancel_channel: bytes) -> None:
        if msg is not None and msg.get("type") in ("message", b"message"):
            self._dispatch(msg["channel"], msg["data"], cancel_channel)

    def _dispatch(self, channel: bytes | str, data: bytes | str, cancel_channel: bytes) -> None:
        if isinstance(channel, str):
            channel = channel.encode()
        if channel == cancel_channel:
            # Anyone may publish here: bytes that are not UTF-8 match no task, never crash.
            task_id = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
            if task_id.startswith(keys.STOP_MARK):
                # Cancelled for good: the exception decides the outcome (SkipRetry:
                # archived). The plain ID that follows finds the handler stopped already.
                task_id = task_id[len(keys.STOP_MARK) :]
                stopped = self.active.cancel(task_id, TaskStoppedError())
                if stopped is not None:
                    self.log.info("task canceled for good (no retry)", **task_fields(stopped.msg))
                return
            canceled = self.active.cancel(task_id, TaskCanceledError())
            if canceled is not None:
                self.log.info("task canceled", **task_fields(canceled.msg))
            return
        if channel == self._delivery_channel and self._on_delivery is not None:
            self._delivered(data if isinstance(data, bytes) else data.encode())
        elif channel in self._wakeups:
            self.stats.wakeup_messages += 1
            self._wakeup.set()
        elif channel == INVALIDATE_CHANNEL:
            # A tracked key (a pending list, a paused flag) was written, or the whole
            # keyspace flushed (no key names): either way, fetch.
            self.stats.invalidations += 1
            self._wakeup.set()
