"""Loading and running Lua scripts kept as ``.lua`` files beside the code that runs them.

Each script is read once, hashed locally and run with EVALSHA; when Redis
answers NOSCRIPT (a restart, ``SCRIPT FLUSH``, a new cluster node) the source
is loaded with SCRIPT LOAD and the call is retried once.

Loading a script is a script's first contact with a server (after a start or a
restart), so it first checks the server's version: a Redis older than 6.2 gets
:class:`~asyncq.errors.UnsupportedServerError` naming what is needed, not an
error from the middle of a script. A script that fails with an unknown command
is checked the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from asyncq._redis.options import RedisClient
from asyncq._redis.transport import FastConnection
from asyncq.errors import UnsupportedServerError

__all__ = ["MIN_REDIS", "Script", "check_server_version", "load_script", "parse_server_version"]

MIN_REDIS = (6, 2)
"""The oldest Redis the scripts run on (ZRANGE BYSCORE/LIMIT, GETDEL, SET GET, ...)."""

_UNKNOWN_COMMAND = ("unknown command", "unknown redis command", "unknown valkey command")

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
        except ResponseError as exc:
            if any(s in str(exc).lower() for s in _UNKNOWN_COMMAND):
                await check_server_version(redis)
            raise

    async def load(self, redis: RedisClient | FastConnection) -> None:
        """SCRIPT LOAD the source (on every primary of a cluster), on a supported server."""
        await check_server_version(redis)
        await redis.script_load(self.source)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


@cache
def load_script(package: str, name: str) -> Script:
    """The script ``lua/<name>.lua`` beside the modules of *package*, read once per process."""
    source = resources.files(package).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return Script(name, source)


def parse_server_version(info: Any) -> tuple[str, str]:
    """``("Redis", "7.0.15")`` or ``("Valkey", "8.1.8")`` from an ``INFO server`` reply.

    The reply is raw text (the pipelined connection) or redis-py's parsed dict
    (a cluster client's: one dict per node, of which the first is taken).
    """
    if isinstance(info, bytes | str):
        text = info.decode(errors="replace") if isinstance(info, bytes) else info
        fields = dict(
            line.split(":", 1) for line in text.splitlines() if ":" in line and line[0] != "#"
        )
    elif isinstance(info, dict) and "redis_version" not in info and info:
        return parse_server_version(next(iter(info.values())))
    elif isinstance(info, dict):
        fields = {str(k): str(v) for k, v in info.items()}
    else:
        raise TypeError(f"not an INFO reply: {info!r}")
    if "valkey_version" in fields:
        return "Valkey", fields["valkey_version"].strip()
    return "Redis", fields.get("redis_version", "").strip()


async def check_server_version(redis: RedisClient | FastConnection) -> None:
    """Raise UnsupportedServerError on a Redis older than :data:`MIN_REDIS`."""
    name, version = parse_server_version(await redis.execute_command("INFO", "server"))
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return  # a Redis-compatible server with its own numbering: let the scripts speak
    if name == "Redis" and major_minor < MIN_REDIS:
        raise UnsupportedServerError(f"Redis {version}")
