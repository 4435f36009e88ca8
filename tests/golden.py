"""The golden Redis snapshot written by the real Go asynq v0.26.0, and a loader for it.

The fixture directory lives outside the repository, in ``shared/fixtures/go-asynq-v0.26/``
beside the clone (``../shared/...`` from the repository root). ``ASYNCQ_GO_FIXTURES`` may
point at it instead. Its files are read, never written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

__all__ = [
    "GoldenKey",
    "fixture_dir",
    "load_keys",
    "restore",
    "snapshot_keys",
    "snapshot_unix",
    "state",
]

FIXTURE_NAME = "go-asynq-v0.26"
REPO_ROOT = Path(__file__).resolve().parents[1]


def fixture_dir() -> Path:
    """The fixture directory; a clear error when it is missing (never a silent skip)."""
    env = os.environ.get("ASYNCQ_GO_FIXTURES")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "fixtures" / FIXTURE_NAME)
    for path in candidates:
        if (path / "state.json").is_file() and (path / "enqueue_bytes.json").is_file():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise FileNotFoundError(
        f"the golden Go asynq fixtures are missing (looked in {tried}); clone the repository "
        "with shared/ beside it or set ASYNCQ_GO_FIXTURES to the fixture directory"
    )


@cache
def _read(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture_dir() / name).read_text())
    return data


def state() -> dict[str, Any]:
    """state.json: snapshot, manifest and every key of DB 0."""
    return _read("state.json")


def enqueue_bytes() -> dict[str, Any]:
    """enqueue_bytes.json: the eleven single-option enqueues and the dump of their DB."""
    return _read("enqueue_bytes.json")


def snapshot_unix() -> float:
    """When the DB 0 snapshot was taken, in unix seconds."""
    return int(state()["snapshot"]["snapshot_start_unix_us"]) / 1_000_000


@dataclass(frozen=True)
class GoldenKey:
    """One dumped key: name, Redis type, PTTL in ms (-1: none) and the raw value."""

    key: str
    type: str
    ttl_ms: int
    value: Any
    decoded: Any

    @property
    def raw(self) -> Any:
        """The value with hex turned back into bytes, in the dump's shape for the type."""
        v = self.value
        if self.type == "string":
            return bytes.fromhex(v)
        if self.type == "hash":
            return {f.encode(): bytes.fromhex(x) for f, x in v.items()}
        if self.type in ("list", "set"):
            return [bytes.fromhex(x) for x in v]
        if self.type == "zset":
            return [(bytes.fromhex(m), float(s)) for m, s in v]
        raise ValueError(f"unknown key type {self.type!r} for {self.key}")


def load_keys(dump: list[dict[str, Any]]) -> dict[str, GoldenKey]:
    return {
        k["key"]: GoldenKey(k["key"], k["type"], int(k["ttl_ms"]), k["value"], k.get("decoded"))
        for k in dump
    }


def snapshot_keys() -> dict[str, GoldenKey]:
    """Every key of the DB 0 snapshot by name."""
    return load_keys(state()["keys"])


async def restore(r: Redis, dump: dict[str, GoldenKey]) -> None:
    """Write every key with its type, value and remaining TTL (lists keep their order)."""
    pipe = r.pipeline(transaction=True)
    for k in dump.values():
        raw = k.raw
        pipe.delete(k.key)
        if k.type == "string":
            pipe.set(k.key, raw)
        elif k.type == "hash":
            pipe.hset(k.key, mapping=raw)
        elif k.type == "list":
            pipe.rpush(k.key, *raw)
        elif k.type == "set":
            pipe.sadd(k.key, *raw)
        else:
            pipe.zadd(k.key, dict(raw))
        if k.ttl_ms > 0:
            pipe.pexpire(k.key, k.ttl_ms)
    await pipe.execute()


async def read_back(r: Redis, key: str) -> tuple[str, Any]:
    """(type, value) of a live key in the dump's raw shape, for exact comparisons."""
    kind = (await r.type(key)).decode()
    if kind == "string":
        return kind, await r.get(key)
    if kind == "hash":
        return kind, await r.hgetall(key)
    if kind == "list":
        return kind, await r.lrange(key, 0, -1)
    if kind == "set":
        return kind, sorted(await r.smembers(key))
    if kind == "zset":
        return kind, [(m, float(s)) for m, s in await r.zrange(key, 0, -1, withscores=True)]
    return kind, None
