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

Loading a script is a script's first contact with a server (after a start or a
restart), so it first checks the server's version: a Redis older than 6.2 gets
:class:`~asyncq.errors.UnsupportedServerError` naming what is needed, not an
error from the middle of a script. A script that fails with an unknown command
is checked the same way.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from asyncq._keys import expected_type
from asyncq._redis.options import RedisClient
from asyncq._redis.transport import FastConnection
from asyncq.errors import UnsupportedServerError

__all__ = [
    "ALLOW_OOM",
    "MIN_REDIS",
    "Script",
    "check_server_version",
    "expand_includes",
    "load_script",
    "parse_server_version",
    "read_script",
]

MIN_REDIS = (6, 2)
"""The oldest Redis the scripts run on (ZRANGE BYSCORE/LIMIT, GETDEL, SET GET, ...)."""

_UNKNOWN_COMMAND = ("unknown command", "unknown redis command", "unknown valkey command")

KeyOrArg = str | bytes | int | float

ALLOW_OOM = frozenset(
    {
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
        "delete_expired_completed_queues",
    }
)
"""Scripts that may run while Redis is out of memory (Redis 7+): each takes work out of
Redis or frees memory, and grows it by at most a few small fields per task."""

_SHEBANG = "#!lua flags="
_INCLUDE = "-- include: "


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


async def _wrong_types(redis: RedisClient | FastConnection, keys: Sequence[str]) -> list[str]:
    """``WRONGTYPE <key> is not a <kind>`` for each of *keys* holding another type than
    asynq stores there: Redis' own WRONGTYPE error names no key."""
    out = []
    for key in keys:
        kind = expected_type(key)
        if kind is None:
            continue
        found = await redis.execute_command("TYPE", key)
        found = found.decode() if isinstance(found, bytes) else str(found)
        if found not in ("none", kind):
            out.append(f"WRONGTYPE {key} is not a {kind}")
    return out


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
            try:
                return await redis.evalsha(self._sha_for(redis), len(keys), *keys, *args)
            except NoScriptError:
                await self.load(redis)
                return await redis.evalsha(self._sha_for(redis), len(keys), *keys, *args)
        except NoScriptError:
            raise
        except ResponseError as exc:
            if any(s in str(exc).lower() for s in _UNKNOWN_COMMAND):
                await check_server_version(redis)
            if str(exc).startswith("WRONGTYPE") and keys:
                named = await _wrong_types(redis, keys)
                if named:
                    raise ResponseError(f"{'; '.join(named)} (script {self.name}: {exc})") from exc
            raise

    async def load(self, redis: RedisClient | FastConnection) -> None:
        """SCRIPT LOAD the source (on every primary of a cluster) on a supported server,
        and its flagged variant where the server takes it."""
        await check_server_version(redis)
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
    """The script ``lua/<name>.lua`` beside the modules of *package*, read once per process,
    with its includes expanded (see :func:`read_script`)."""
    return Script(name, read_script(package, name))


def read_script(package: str, name: str) -> str:
    """The source of ``lua/<name>.lua`` beside the modules of *package*, as Redis runs it:
    its includes expanded from ``lua/_lib`` (see :func:`expand_includes`)."""
    folder = resources.files(package).joinpath("lua")
    source = folder.joinpath(f"{name}.lua").read_text("utf-8")
    return expand_includes(source, f"lua/{name}.lua", folder.joinpath("_lib"))


def expand_includes(source: str, name: str, lib: Traversable) -> str:
    """*source* (the script *name*) with each ``-- include: a, b`` line replaced by the
    text of ``a.lua`` then ``b.lua`` from the folder *lib*.

    Code several scripts share (the key-type guard, the counter updates) is written once,
    in ``lua/_lib/<part>.lua``; a script names what it uses on a line of its own, and
    that line is replaced by those files' text, in that order. Each script thus stays
    one file to read, and the text Redis runs is the one it ran when the code was
    copied into each script. A part that does not exist raises FileNotFoundError
    naming the script and the missing file.
    """
    lines = []
    for line in source.split("\n"):
        if not line.startswith(_INCLUDE):
            lines.append(line)
            continue
        for part in (p.strip() for p in line.removeprefix(_INCLUDE).split(",")):
            path = lib.joinpath(f"{part}.lua")
            if not part or not path.is_file():
                raise FileNotFoundError(f"{name} includes {part!r}, but there is no file {path}")
            lines.append(path.read_text("utf-8").removesuffix("\n"))
    return "\n".join(lines)


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
    try:
        reply = await redis.execute_command("INFO", "server")
    except NoPermissionError:
        return  # an ACL user without INFO: the scripts themselves say what the server lacks
    name, version = parse_server_version(reply)
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return  # a Redis-compatible server with its own numbering: let the scripts speak
    if name == "Redis" and major_minor < MIN_REDIS:
        raise UnsupportedServerError(f"Redis {version}")
