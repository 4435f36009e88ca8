"""Worker side of waiting for a result: publishing the IDs of finished tasks.

The waiting side, and the reasons for a channel rather than polling alone, are in
:mod:`asyncq._producer.completion`; the channel's name is :func:`asyncq._keys.completion_channel`.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncq import _keys as keys
from asyncq._batch import TurnBatcher
from asyncq._logging import get_logger
from asyncq._redis.options import RedisClient

__all__ = ["CompletionNotifier"]

log = get_logger()


class CompletionNotifier:
    """Worker side: publishes finished task IDs, coalescing one event-loop turn into a pipeline.

    Best effort: a publish that fails (Redis unreachable, an ACL user without
    channel rights) is logged at debug level; waiters then find the outcome by
    polling.
    """

    __slots__ = ("_batch", "_redis")

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._batch: TurnBatcher[tuple[str, str]] = TurnBatcher(self._send)

    def notify(self, queue: str, task_id: str) -> None:
        self._batch.add((keys.completion_channel(queue), task_id))

    async def _send(self, batch: Sequence[tuple[str, str]]) -> None:
        try:
            if hasattr(self._redis, "get_nodes"):  # cluster: PUBLISH is broadcast anyway
                for channel, task_id in batch:
                    await self._redis.publish(channel, task_id)
                return
            pipe = self._redis.pipeline(transaction=False)
            for channel, task_id in batch:
                pipe.publish(channel, task_id)
            await pipe.execute()
        except Exception as exc:
            log.debug("completion notification not published", error=str(exc), count=len(batch))

    async def aclose(self) -> None:
        """Send what is pending and wait for the sends in flight."""
        await self._batch.aclose()
