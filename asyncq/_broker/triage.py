"""The Redis side of failure triage: read failed tasks in bounded chunks, act on a group.

Reading never loads a whole sorted set: it pages through it newest first
(``ZREVRANGE`` of :data:`CHUNK` ids, then one pipelined ``HGET msg`` per id), so
a queue with 100,000 archived tasks costs a few hundred round trips of a few
hundred kilobytes each and the caller can stop at any cap. Acting goes through
``lua/inspect_error_group_action.lua``, which moves a task only when it is still
where and what it was when read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import ARCHIVE_MAX_SIZE, ARCHIVED_EXPIRATION, LUA_PACKAGE
from asyncq._codec import decode_task_message
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import load_script
from asyncq.errors import BrokerError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import TaskState

__all__ = ["CHUNK", "FailedTask", "TriageBroker"]

CHUNK = 500
"""Task ids read (and acted on) per round trip."""

_ZSETS = {TaskState.RETRY: keys.retry_key, TaskState.ARCHIVED: keys.archived_key}


@dataclass(frozen=True, slots=True)
class FailedTask:
    """One retry or archived task as read for triage."""

    id: str
    queue: str
    state: TaskState
    message: TaskMessage | None
    """None when the stored message cannot be decoded."""
    score: int
    """The sorted-set score: the archive time (archived) or the next attempt (retry)."""
    digest: str
    """SHA1 of the stored message bytes: the action script acts only if it is unchanged."""


def _str(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class TriageBroker:
    """Chunked reads of a queue's retry/archived sets and the group action script."""

    def __init__(self, redis: RedisClient, *, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.clock = clock

    async def size(self, qname: str, state: TaskState) -> int:
        """Tasks in the state's sorted set."""
        return int(await self.redis.zcard(_ZSETS[state](qname)))

    async def scan(
        self, qname: str, state: TaskState, *, limit: int | None = None
    ) -> AsyncGenerator[list[FailedTask], None]:
        """Chunks of the state's tasks, newest score first, at most *limit* in all.

        Tasks removed between the two reads of a chunk are left out; an id seen
        twice (the set shifted while paging) is yielded once.
        """
        zkey = _ZSETS[state](qname)
        prefix = keys.task_key_prefix(qname)
        seen: set[str] = set()
        start = 0
        left = limit
        while left is None or left > 0:
            count = CHUNK if left is None else min(CHUNK, left)
            entries: list[Any] = await self.redis.zrevrange(
                zkey, start, start + count - 1, withscores=True
            )
            if not entries:
                return
            start += len(entries)
            ids = [_str(member) for member, _ in entries]
            async with self.redis.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.hget(prefix + task_id, "msg")
                # A key another program broke (not a hash) is skipped, not fatal to the report.
                raws = await pipe.execute(raise_on_error=False)
            chunk: list[FailedTask] = []
            for task_id, (_, score), raw in zip(ids, entries, raws, strict=True):
                if not isinstance(raw, bytes) or task_id in seen:
                    continue
                seen.add(task_id)
                try:
                    msg: TaskMessage | None = decode_task_message(raw)
                except ValueError:
                    msg = None
                digest = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
                chunk.append(FailedTask(task_id, qname, state, msg, int(score), digest))
            if left is not None:
                left -= len(entries)
            if chunk:
                yield chunk
            if len(entries) < count:
                return

    async def act(
        self, qname: str, state: TaskState, action: str, tasks: Sequence[tuple[str, str]]
    ) -> list[str]:
        """Run, archive or delete *tasks* (``(id, digest)`` pairs read in *state*) in chunks;
        returns the ids acted on (the others had moved or changed)."""
        now = self.clock()
        script = load_script(LUA_PACKAGE, "inspect_error_group_action")
        script_keys = [_ZSETS[state](qname), keys.pending_key(qname), keys.archived_key(qname)]
        head: list[str | int] = [
            action,
            state.value,
            keys.task_key_prefix(qname),
            int(now),
            int(now * 1e9),
            int(now - ARCHIVED_EXPIRATION),
            ARCHIVE_MAX_SIZE,
        ]
        done: list[str] = []
        for i in range(0, len(tasks), CHUNK):
            args = list(head)
            for task_id, digest in tasks[i : i + CHUNK]:
                args += [task_id, digest]
            try:
                reply = await script(self.redis, script_keys, args)
            except ResponseError as exc:
                raise BrokerError(f"inspect_error_group_action: {exc}") from exc
            done.extend(_str(x) for x in reply)
        return done
