"""The golden Redis snapshot written by the real Go asynq v0.26.0, and a loader for it.

The fixture directory is ``tests/fixtures/go-asynq-v0.26/``: byte-for-byte copies of what
the real Go asynq v0.26.0 wrote (see its README.md). Its files are read, never written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

__all__ = [
    "DIGESTS",
    "GoldenKey",
    "fixture_dir",
    "load_keys",
    "restore",
    "snapshot_keys",
    "snapshot_unix",
    "state",
]

FIXTURE_NAME = "go-asynq-v0.26"
DIGESTS = {
    "enqueue_bytes.json": "c87923dda60198cb743369ac521dceb0a8539d2c13036606e7ea9eb7413aa804",
    "gogolden.log": "308776134e53657878dd34def312459669c790fb1bd4d840b80c1119339986c9",
    "scenario.md": "2dbb541709c8ea1c5469bfa2c3d2be0fe78559a8e1d64a25e39b3a388a3d9d83",
    "state.json": "012261890636874b0d7c0a3917435277508cda8811f18ed2722c36a2a6169ac0",
}
"""sha256 of each file as Go asynq v0.26.0 wrote it: the copies here must never be edited."""


def fixture_dir() -> Path:
    """The fixture directory; a clear error when a file is missing (never a silent skip)."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / FIXTURE_NAME
    missing = [n for n in ("state.json", "enqueue_bytes.json") if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the golden Go asynq fixtures are incomplete: {path} lacks {missing}"
        )
    return path


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
