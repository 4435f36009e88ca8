"""Loading and running Lua scripts kept as ``.lua`` files beside the code that runs them.

Each script is read once, hashed locally and run with EVALSHA; when Redis
answers NOSCRIPT (a restart, ``SCRIPT FLUSH``, a new cluster node) the source
is loaded with SCRIPT LOAD and the call is retried once.

Scripts named in :data:`ALLOW_OOM` (the transitions that drain a full Redis:
dequeue, acknowledgement, deletion) also have a variant that starts with
``#!lua flags=allow-oom``, so Redis 7+ runs them while ``maxmemory`` is reached
(noeviction). Redis 6.2 has no script flags and refuses that line: the first
SCRIPT LOAD of the variant on a connection finds out, and from then on that
connection runs the plain script (which 6.2 refuses at its first growing write
when out of memory). Calls through :meth:`Script.__call__` pick the variant;
callers that pipeline ``EVALSHA script.sha`` themselves run the plain one.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from asyncq._redis.options import RedisClient
from asyncq._redis.transport import FastConnection

__all__ = ["ALLOW_OOM", "Script", "load_script"]

KeyOrArg = str | bytes | int | float

ALLOW_OOM = frozenset(
    {
        "dequeue_many",
        "dequeue_queues",
        "done",
        "ack_many",
        "ack_queues",
        "mark_as_complete",
        "requeue",
        "inspect_delete_task",
        "inspect_delete_all",
        "inspect_delete_all_pending",
        "inspect_delete_all_aggregating",
        "inspect_remove_queue",
        "delete_expired_completed",
        "delete_expired_completed_queues",
    }
)
"""Scripts that may run while Redis is out of memory (Redis 7+): each takes work out of
Redis or frees memory, and grows it by at most a few small fields per task."""

_SHEBANG = "#!lua flags="


def _with_allow_oom(source: str) -> str:
    """*source* with the allow-oom flag added to its shebang line (or a new one)."""
    if source.startswith(_SHEBANG):
        line, _, rest = source.partition("\n")
        return f"{line},allow-oom\n{rest}"
    if source.startswith("#!lua"):
        line, _, rest = source.partition("\n")
        return f"{line} flags=allow-oom\n{rest}"
    return f"{_SHEBANG}allow-oom\n{source}"


# Connections (redis-py clients, FastConnections) whose server refused the shebang line.
_NO_FLAGS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


class Script:
    """A Lua script identified by its SHA1, run with EVALSHA and reloaded on NOSCRIPT."""

    __slots__ = ("flagged_sha", "flagged_source", "name", "sha", "source")

    def __init__(self, name: str, source: str, *, allow_oom: bool | None = None) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.flagged_source: str | None = None
        self.flagged_sha: str | None = None
        if name in ALLOW_OOM if allow_oom is None else allow_oom:
            self.flagged_source = _with_allow_oom(source)
            self.flagged_sha = hashlib.sha1(self.flagged_source.encode()).hexdigest()

    def _sha_for(self, redis: RedisClient | FastConnection) -> str:
        if self.flagged_sha is None or redis in _NO_FLAGS:
            return self.sha
        return self.flagged_sha

    async def __call__(
        self,
        redis: RedisClient | FastConnection,
        keys: Sequence[str],
        args: Sequence[KeyOrArg] = (),
    ) -> Any:
        try:
            return await redis.evalsha(self._sha_for(redis), len(keys), *keys, *args)
        except NoScriptError:
            await self.load(redis)
            return await redis.evalsha(self._sha_for(redis), len(keys), *keys, *args)

    async def load(self, redis: RedisClient | FastConnection) -> None:
        """SCRIPT LOAD the source (on every primary of a cluster), and its flagged variant
        where the server takes it."""
        await redis.script_load(self.source)
        if self.flagged_source is None or redis in _NO_FLAGS:
            return
        try:
            await redis.script_load(self.flagged_source)
        except NoScriptError:
            raise
        except ResponseError:
            # Redis < 7 (or a compatible server without script flags): "Error compiling
            # script ... unexpected symbol near '#'". Run the plain script there.
            _NO_FLAGS[redis] = True

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


@cache
def load_script(package: str, name: str) -> Script:
    """The script ``lua/<name>.lua`` beside the modules of *package*, read once per process."""
    source = resources.files(package).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return Script(name, source)
