"""Worker side of waiting for a result: publishing the IDs of finished tasks.

The waiting side, and the reasons for a channel rather than polling alone, are in
:mod:`asyncq._producer.completion`; the channel's name is :func:`asyncq._keys.completion_channel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from asyncq import _keys as keys
from asyncq._batch import TurnBatcher
from asyncq._logging import get_logger

__all__ = ["CompletionNotifier", "CompletionPublisher"]

log = get_logger()


class CompletionPublisher(Protocol):
    """Where the notices go: the worker's broker (:mod:`asyncq._broker.observations`)."""

    async def publish_completions(self, notices: Sequence[tuple[str, str]]) -> None: ...


class CompletionNotifier:
    """Worker side: publishes finished task IDs, coalescing one event-loop turn into a pipeline.

    Best effort: a publish that fails (Redis unreachable, an ACL user without
    channel rights) is logged at debug level; waiters then find the outcome by
    polling.
    """

    __slots__ = ("_batch", "_publisher")

    def __init__(self, publisher: CompletionPublisher) -> None:
        self._publisher = publisher
        self._batch: TurnBatcher[tuple[str, str]] = TurnBatcher(self._send)

    def notify(self, queue: str, task_id: str) -> None:
        self._batch.add((keys.completion_channel(queue), task_id))

    async def _send(self, batch: Sequence[tuple[str, str]]) -> None:
        try:
            await self._publisher.publish_completions(batch)
        except Exception as exc:
            log.debug("completion notification not published", error=str(exc), count=len(batch))

    async def aclose(self) -> None:
        """Send what is pending and wait for the sends in flight."""
        await self._batch.aclose()
