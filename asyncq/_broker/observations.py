"""What a worker tells its observers, written through its broker like everything else it writes.

Four writes that are not task transitions: the IDs of finished tasks (for callers
waiting on a result), the task event stream (a Client's enqueue events go there too),
a running handler's progress and the metrics history. Go asynq reads none of them.
Each method raises what Redis raised: the writer decides what a failure means (the
first three are best effort and logged at debug level; the history keeps its counts
for the next flush).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from asyncq import _keys as keys
from asyncq._broker._base import BrokerBase
from asyncq._redis.scripts import load_script

__all__ = ["Observations"]

_RECORD_METRICS = load_script("asyncq.history", "record_metrics")


class Observations(BrokerBase):
    """Completion notices, events, progress and metrics history."""

    async def publish_completions(self, notices: Sequence[tuple[str, str]]) -> None:
        """PUBLISH each ``(channel, task id)``, in one pipeline (one by one on a cluster,
        where a PUBLISH reaches every node whichever node takes it)."""
        if hasattr(self.redis, "get_nodes"):
            for channel, task_id in notices:
                await self.redis.publish(channel, task_id)
            return
        pipe = self.redis.pipeline(transaction=False)
        for channel, task_id in notices:
            pipe.publish(channel, task_id)
        await pipe.execute()

    async def append_events(self, events: Sequence[Mapping[str, str]], max_events: int) -> None:
        """XADD each event to the event stream, trimmed to about *max_events*."""
        pipe = self.redis.pipeline(transaction=False)
        for fields in events:
            pipe.xadd(keys.EVENTS_KEY, dict(fields), maxlen=max_events, approximate=True)  # type: ignore[arg-type]
        await pipe.execute()

    async def write_progress(
        self, queue: str, task_id: str, fields: Mapping[str, str], ttl_ms: int, update: str
    ) -> None:
        """Store a task's progress *fields* for *ttl_ms* (0 or less: delete them) and
        publish *update* on the queue's progress channel, in one pipeline."""
        key = keys.progress_key(queue, task_id)
        pipe = self.redis.pipeline(transaction=False)
        if ttl_ms > 0:
            pipe.hset(key, mapping=dict(fields))  # type: ignore[arg-type]
            pipe.pexpire(key, ttl_ms)
        else:
            pipe.delete(key)
        pipe.publish(keys.progress_channel(queue), update)
        await pipe.execute()

    async def expire_progress(self, queue: str, task_id: str, ttl_ms: int) -> None:
        """Keep a task's stored progress *ttl_ms* more (0 or less: delete it now)."""
        key = keys.progress_key(queue, task_id)
        if ttl_ms > 0:
            await self.redis.pexpire(key, ttl_ms)
        else:
            await self.redis.delete(key)

    async def write_history(
        self, queue: str, minute: int, expire_at: int, counts: Sequence[str | int]
    ) -> None:
        """Add *counts* (field, number, ...) to *queue*'s metrics-history hash of the unix
        *minute*, which expires at *expire_at* (unix seconds)."""
        await _RECORD_METRICS(
            self._cmd, [keys.metrics_history_key(queue, minute)], [expire_at, *counts]
        )
