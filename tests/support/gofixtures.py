"""Redis states written exactly the way Go asynq v0.26 writes them (spec sections 2-4).

The protobuf bytes are produced by a small independent encoder that follows the
wire rules Go's ``proto.Marshal`` applies (fields in number order, proto3 zero
values omitted, Timestamps always present, Go's zero time for "never"), so the
Inspector's decoding is checked against bytes that do not come from betterproto2.
Key names are spelled out here by hand from the spec, not taken from asyncq._keys.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

GO_ZERO_UNIX = -62135596800


# -- protobuf wire encoding -------------------------------------------------------------------


def varint(n: int) -> bytes:
    """Base-128 varint; negatives as their 64-bit two's complement (ten bytes)."""
    if n < 0:
        n += 1 << 64  # int32/int64 negatives take ten bytes on the wire
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(num: int, wire: int) -> bytes:
    return varint((num << 3) | wire)


def _int_field(num: int, value: int) -> bytes:
    return _tag(num, 0) + varint(value) if value else b""


def _bool_field(num: int, value: bool) -> bytes:
    return _tag(num, 0) + b"\x01" if value else b""


def _bytes_field(num: int, value: bytes, *, always: bool = False) -> bytes:
    if not value and not always:
        return b""
    return _tag(num, 2) + varint(len(value)) + value


def _str_field(num: int, value: str) -> bytes:
    return _bytes_field(num, value.encode())


def _timestamp(num: int, when: datetime | None) -> bytes:
    # timestamppb.New(t): always present; Go's zero time for "never".
    if when is None:
        seconds, nanos = GO_ZERO_UNIX, 0
    else:
        delta = when - datetime(1970, 1, 1, tzinfo=UTC)
        seconds = delta.days * 86400 + delta.seconds
        nanos = delta.microseconds * 1000
    body = _int_field(1, seconds) + _int_field(2, nanos)
    return _bytes_field(num, body, always=True)


# Go writes both fields of every map entry, zero values included.
def _map_str(num: int, m: dict[str, str]) -> bytes:
    return b"".join(
        _bytes_field(
            num,
            _bytes_field(1, k.encode(), always=True) + _bytes_field(2, v.encode(), always=True),
            always=True,
        )
        for k, v in m.items()
    )


def _map_str_int(num: int, m: dict[str, int]) -> bytes:
    return b"".join(
        _bytes_field(
            num, _bytes_field(1, k.encode(), always=True) + _tag(2, 0) + varint(v), always=True
        )
        for k, v in m.items()
    )


# -- protobuf wire decoding (independent of asyncq's generated classes) ------------------------


def read_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) in wire order; varints as unsigned ints, length-delimited as bytes."""
    out: list[tuple[int, int | bytes]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            if i >= len(buf):
                raise ValueError("truncated varint")
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while i < len(buf):
        tag = varint()
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            out.append((num, varint()))
        elif wire == 2:
            n = varint()
            if i + n > len(buf):
                raise ValueError("truncated length-delimited field")
            out.append((num, buf[i : i + n]))
            i += n
        else:
            raise ValueError(f"unexpected wire type {wire} for field {num}")
    return out


def fields_by_number(buf: bytes) -> dict[int, list[int | bytes]]:
    """Every value of each field number, in wire order."""
    out: dict[int, list[int | bytes]] = {}
    for num, value in read_fields(buf):
        out.setdefault(num, []).append(value)
    return out


def signed64(v: int | bytes) -> int:
    """A varint read as Go's int64 (ten-byte negatives come back negative)."""
    assert isinstance(v, int)
    return v - (1 << 64) if v >= 1 << 63 else v


def _text(v: int | bytes) -> str:
    assert isinstance(v, bytes)
    return v.decode()


@dataclass
class GoTask:
    """asynq's TaskMessage fields; ``encode()`` gives Go's wire bytes."""

    type: str
    payload: bytes = b""
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    queue: str = "default"
    retry: int = 25
    retried: int = 0
    error_msg: str = ""
    timeout: int = 1800
    deadline: int = 0
    unique_key: str = ""
    last_failed_at: int = 0
    retention: int = 0
    completed_at: int = 0
    group_key: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return b"".join(
            [
                _str_field(1, self.type),
                _bytes_field(2, self.payload),
                _str_field(3, self.id),
                _str_field(4, self.queue),
                _int_field(5, self.retry),
                _int_field(6, self.retried),
                _str_field(7, self.error_msg),
                _int_field(8, self.timeout),
                _int_field(9, self.deadline),
                _str_field(10, self.unique_key),
                _int_field(11, self.last_failed_at),
                _int_field(12, self.retention),
                _int_field(13, self.completed_at),
                _str_field(14, self.group_key),
                _map_str(15, self.headers),
            ]
        )

    @property
    def key(self) -> str:
        return f"asynq:{{{self.queue}}}:t:{self.id}"

    @classmethod
    def decode(cls, buf: bytes) -> GoTask:
        """Parse TaskMessage bytes the way Go's proto.Unmarshal reads them (absent = zero)."""
        t = cls(type="", id="", queue="", retry=0, timeout=0)
        ints = {5: "retry", 6: "retried", 8: "timeout", 9: "deadline", 11: "last_failed_at"}
        ints |= {12: "retention", 13: "completed_at"}
        strs = {1: "type", 3: "id", 4: "queue", 7: "error_msg", 10: "unique_key", 14: "group_key"}
        for num, v in read_fields(buf):
            if num in ints:
                setattr(t, ints[num], signed64(v))
            elif num in strs:
                setattr(t, strs[num], _text(v))
            elif num == 2:
                assert isinstance(v, bytes)
                t.payload = v
            elif num == 15:
                assert isinstance(v, bytes)
                entry = dict(read_fields(v))
                t.headers[_text(entry.get(1, b""))] = _text(entry.get(2, b""))
            else:
                raise ValueError(f"unknown TaskMessage field {num}")
        return t


@dataclass
class GoWorker:
    task: GoTask
    started: datetime
    deadline: datetime


def encode_server_info(
    *,
    host: str,
    pid: int,
    server_id: str,
    concurrency: int,
    queues: dict[str, int],
    strict_priority: bool,
    status: str,
    started: datetime,
    active_worker_count: int,
) -> bytes:
    return b"".join(
        [
            _str_field(1, host),
            _int_field(2, pid),
            _str_field(3, server_id),
            _int_field(4, concurrency),
            _map_str_int(5, queues),
            _bool_field(6, strict_priority),
            _str_field(7, status),
            _timestamp(8, started),
            _int_field(9, active_worker_count),
        ]
    )


def encode_worker_info(host: str, pid: int, server_id: str, w: GoWorker) -> bytes:
    return b"".join(
        [
            _str_field(1, host),
            _int_field(2, pid),
            _str_field(3, server_id),
            _str_field(4, w.task.id),
            _str_field(5, w.task.type),
            _bytes_field(6, w.task.payload),
            _str_field(7, w.task.queue),
            _timestamp(8, w.started),
            _timestamp(9, w.deadline),
        ]
    )


def encode_scheduler_entry(
    *,
    entry_id: str,
    spec: str,
    task_type: str,
    payload: bytes,
    options: list[str],
    next_at: datetime,
    prev_at: datetime | None,
) -> bytes:
    return b"".join(
        [
            _str_field(1, entry_id),
            _str_field(2, spec),
            _str_field(3, task_type),
            _bytes_field(4, payload),
            *(_bytes_field(5, o.encode(), always=True) for o in options),
            _timestamp(6, next_at),
            _timestamp(7, prev_at),
        ]
    )


def encode_enqueue_event(task_id: str, enqueued_at: datetime) -> bytes:
    return _str_field(1, task_id) + _timestamp(2, enqueued_at)


# -- Redis writes, as asynq's scripts leave them ----------------------------------------------


def unix(when: datetime) -> int:
    return int(when.timestamp())


def _p(queue: str) -> str:
    return f"asynq:{{{queue}}}:"


async def register_queue(r: Redis, queue: str) -> None:
    await r.sadd("asynq:queues", queue)


async def enqueue(r: Redis, t: GoTask, now: datetime) -> None:
    """Client.Enqueue: msg, state=pending, pending_since (ns); LPUSH pending."""
    await register_queue(r, t.queue)
    fields = {"msg": t.encode(), "state": "pending", "pending_since": str(unix_ns(now))}
    if t.unique_key:
        await r.set(t.unique_key, t.id, ex=3600, nx=True)
        fields["unique_key"] = t.unique_key
    await r.hset(t.key, mapping=fields)
    await r.lpush(_p(t.queue) + "pending", t.id)


def unix_ns(when: datetime) -> int:
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


async def schedule(r: Redis, t: GoTask, process_at: datetime) -> None:
    """Client.Enqueue with ProcessAt in the future: msg, state=scheduled; ZADD scheduled."""
    await register_queue(r, t.queue)
    fields = {"msg": t.encode(), "state": "scheduled"}
    if t.unique_key:
        await r.set(t.unique_key, t.id, ex=3600, nx=True)
        fields["unique_key"] = t.unique_key
    await r.hset(t.key, mapping=fields)
    await r.zadd(_p(t.queue) + "scheduled", {t.id: unix(process_at)})


async def add_to_group(r: Redis, t: GoTask, now: datetime) -> None:
    """Client.Enqueue with Group: msg, state=aggregating, group; ZADD g:<group>; SADD groups."""
    assert t.group_key
    await register_queue(r, t.queue)
    await r.hset(t.key, mapping={"msg": t.encode(), "state": "aggregating", "group": t.group_key})
    await r.zadd(_p(t.queue) + "g:" + t.group_key, {t.id: unix(now)})
    await r.sadd(_p(t.queue) + "groups", t.group_key)


async def seed_aggregation_set(
    r: Redis, queue: str, group: str, tasks: list[GoTask], added: datetime, deadline: datetime
) -> str:
    """AggregationCheck's result: tasks moved from g:<group> into g:<group>:<set id>."""
    set_id = str(uuid.uuid4())
    set_key = f"{_p(queue)}g:{group}:{set_id}"
    await register_queue(r, queue)
    for t in tasks:
        await r.hset(t.key, mapping={"msg": t.encode(), "state": "aggregating", "group": group})
        await r.zadd(set_key, {t.id: unix(added)})
    await r.zadd(_p(queue) + "aggregation_sets", {set_key: unix(deadline)})
    return set_key


async def seed_active(r: Redis, t: GoTask, lease_expiry: datetime) -> None:
    """After Dequeue: state=active, no pending_since, in active list and lease zset."""
    await register_queue(r, t.queue)
    await r.hset(t.key, mapping={"msg": t.encode(), "state": "active"})
    await r.lpush(_p(t.queue) + "active", t.id)
    await r.zadd(_p(t.queue) + "lease", {t.id: unix(lease_expiry)})


async def seed_retry(r: Redis, t: GoTask, retry_at: datetime) -> None:
    """After Retry: the message carries retried/error_msg/last_failed_at; ZADD retry."""
    await register_queue(r, t.queue)
    await r.hset(t.key, mapping={"msg": t.encode(), "state": "retry"})
    await r.zadd(_p(t.queue) + "retry", {t.id: unix(retry_at)})


async def seed_archived(r: Redis, t: GoTask, archived_at: datetime) -> None:
    await register_queue(r, t.queue)
    await r.hset(t.key, mapping={"msg": t.encode(), "state": "archived"})
    await r.zadd(_p(t.queue) + "archived", {t.id: unix(archived_at)})


async def seed_completed(r: Redis, t: GoTask, result: bytes | None = None) -> None:
    """After MarkAsComplete: completed_at in the message, scored by completed_at + retention."""
    assert t.completed_at and t.retention
    await register_queue(r, t.queue)
    fields: dict[str, bytes | str] = {"msg": t.encode(), "state": "completed"}
    if result is not None:
        fields["result"] = result
    await r.hset(t.key, mapping=fields)
    await r.zadd(_p(t.queue) + "completed", {t.id: t.completed_at + t.retention})


async def seed_daily(r: Redis, queue: str, day: datetime, processed: int, failed: int) -> None:
    d = day.astimezone(UTC).strftime("%Y-%m-%d")
    await r.set(f"{_p(queue)}processed:{d}", processed)
    await r.set(f"{_p(queue)}failed:{d}", failed)


async def seed_totals(r: Redis, queue: str, processed: int, failed: int) -> None:
    await r.set(_p(queue) + "processed", processed)
    await r.set(_p(queue) + "failed", failed)


async def seed_paused(r: Redis, queue: str, at: datetime) -> None:
    await r.set(_p(queue) + "paused", unix(at), nx=True)


async def seed_server(
    r: Redis,
    *,
    now: datetime,
    host: str = "go-host",
    pid: int = 4242,
    server_id: str | None = None,
    concurrency: int = 10,
    queues: dict[str, int] | None = None,
    strict_priority: bool = False,
    status: str = "active",
    started: datetime | None = None,
    workers: list[GoWorker] = (),  # type: ignore[assignment]
    ttl: int = 10,
) -> str:
    """Heartbeater.WriteServerState: server string, workers hash, both index zsets."""
    server_id = server_id or str(uuid.uuid4())
    skey = f"asynq:servers:{{{host}:{pid}:{server_id}}}"
    wkey = f"asynq:workers:{{{host}:{pid}:{server_id}}}"
    expiry = unix(now) + ttl
    await r.zadd("asynq:servers", {skey: expiry})
    await r.zadd("asynq:workers", {wkey: expiry})
    info = encode_server_info(
        host=host,
        pid=pid,
        server_id=server_id,
        concurrency=concurrency,
        queues=queues or {"default": 1},
        strict_priority=strict_priority,
        status=status,
        started=started or now,
        active_worker_count=len(workers),
    )
    await r.set(skey, info, ex=ttl)  # SETEX
    await r.delete(wkey)
    for w in workers:
        await r.hset(wkey, w.task.id, encode_worker_info(host, pid, server_id, w))
    await r.expire(wkey, ttl)
    return server_id


async def seed_scheduler(
    r: Redis, scheduler_id: str, entries: list[bytes], now: datetime, ttl: int = 20
) -> None:
    """Scheduler heartbeat: DEL, LPUSH each entry, EXPIRE; ZADD asynq:schedulers."""
    key = f"asynq:schedulers:{{{scheduler_id}}}"
    await r.zadd("asynq:schedulers", {key: unix(now) + ttl})
    await r.delete(key)
    for e in entries:
        await r.lpush(key, e)
    await r.expire(key, ttl)


async def seed_enqueue_event(r: Redis, entry_id: str, task_id: str, at: datetime) -> None:
    await r.zadd(
        f"asynq:scheduler_history:{entry_id}", {encode_enqueue_event(task_id, at): unix(at)}
    )


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ago(now: datetime, **kw: float) -> datetime:
    return now - timedelta(**kw)
