"""Loading and running Lua scripts kept as ``.lua`` files beside the code that runs them.

Each script is read once, hashed locally and run with EVALSHA; when Redis
answers NOSCRIPT (a restart, ``SCRIPT FLUSH``, a new cluster node) the source
is loaded with SCRIPT LOAD and the call is retried once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from asyncq._redis.options import RedisClient
from asyncq._redis.transport import FastConnection

__all__ = ["Script", "load_script"]

KeyOrArg = str | bytes | int | float


class Script:
    """A Lua script identified by its SHA1, run with EVALSHA and reloaded on NOSCRIPT."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(
        self,
        redis: RedisClient | FastConnection,
        keys: Sequence[str],
        args: Sequence[KeyOrArg] = (),
    ) -> Any:
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.load(redis)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)

    async def load(self, redis: RedisClient | FastConnection) -> None:
        """SCRIPT LOAD the source (on every primary of a cluster)."""
        await redis.script_load(self.source)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


@cache
def load_script(package: str, name: str) -> Script:
    """The script ``lua/<name>.lua`` beside the modules of *package*, read once per process."""
    source = resources.files(package).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return Script(name, source)
