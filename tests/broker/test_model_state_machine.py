"""A model of asynq's task state machine, checked against the broker on a real Redis.

A hypothesis ``RuleBasedStateMachine`` performs what producers, workers and the
Inspector do (enqueue with every option, batches, task-id and unique conflicts, dequeue
over several queues with pauses, limits and ordered queues, ack with and without
retention, retry, archive, requeue, lease recovery, forwarding, group aggregation and
its recovery, the janitor, Inspector delete/run/archive of one task or a whole state,
idle workers arming and disarming direct delivery, listening or gone, and enqueues that
deliver to them) through the real :class:`~asyncq._broker.Broker`,
:class:`~asyncq._broker.multiqueue.MultiQueue` and :class:`~asyncq.Inspector`, and the
same steps on a plain-Python model of asynq's state machine (asynq v0.26's Redis layout
and transitions). After every step the WHOLE database must equal what the model
predicts: every key, its type, list order, set and hash members, sorted-set scores, and
TTLs (exact for the daily counters, present and bounded for unique locks, delivery
credits and waiters lists, absent elsewhere). The replies (the tasks a dequeue hands
out, the expired leases listed, the aggregation set read back, each delivery note, each
error) are checked too.

Time is the broker's injectable clock, moved by a rule, never by sleeping. The
default suite runs a small derandomized search (the ``default`` profile in
conftest); ``nox -s fuzz`` runs a long randomized one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from asyncq import Inspector
from asyncq import _keys as keys
from asyncq._broker import BatchItem, Broker, PendingItem
from asyncq._broker._base import AGGREGATION_TIMEOUT, STATS_TTL
from asyncq._broker.delivery import WAITERS_TTL, parse_note
from asyncq._broker.multiqueue import MultiQueue
from asyncq._codec import decode_task_message, encode_task_message
from asyncq.errors import (
    BrokerError,
    DuplicateTaskError,
    FailedPreconditionError,
    QueueNotFoundError,
    TaskIdConflictError,
    TaskNotFoundError,
)
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.helpers import FakeClock

QUEUES = ("qa", "qb", "qc")
IDS = tuple(f"t{i}" for i in range(10))
GROUPS = ("g1", "g2")
TYPES = ("email", "sms")
PAYLOADS = (b"x", b"y")
LOCK_TTL = 3600
SERVERS = ("s1", "s2")
CREDIT_TTL = 600  # real seconds (a Redis TTL): longer than any example runs
LEASE = 30
ZSETS = ("scheduled", "retry", "archived", "completed")
NS = 1_000_000_000

Key = tuple[str, str]  # (queue, task id)


def _copy(msg: TaskMessage, **changes: Any) -> TaskMessage:
    out = decode_task_message(encode_task_message(msg))
    for name, value in changes.items():
        setattr(out, name, value)
    return out


@dataclass
class ModelTask:
    msg: TaskMessage
    state: str
    fields: dict[str, bytes] = field(default_factory=dict)
    """Hash fields besides msg and state: pending_since, unique_key, group, result."""

    def hash(self) -> dict[bytes, bytes]:
        out = {b"msg": encode_task_message(self.msg), b"state": self.state.encode()}
        out.update({k.encode(): v for k, v in self.fields.items()})
        return out


@dataclass
class ModelQueue:
    pending: list[str] = field(default_factory=list)  # index 0 = head (LPUSH end)
    active: list[str] = field(default_factory=list)
    lease: dict[str, int] = field(default_factory=dict)
    z: dict[str, dict[str, int]] = field(default_factory=lambda: {s: {} for s in ZSETS})
    groups: set[str] = field(default_factory=set)
    g: dict[str, dict[str, int]] = field(default_factory=dict)
    sets: dict[str, dict[str, int]] = field(default_factory=dict)  # set key -> members
    agg: dict[str, int] = field(default_factory=dict)  # set key -> deadline
    paused: int | None = None
    limit: int | None = None
    ordered: bool = False
    processed: int = 0
    failed: int = 0


def _sorted_members(members: dict[str, int]) -> list[str]:
    """ZRANGE order: by score, ties by member."""
    return [m for _, m in sorted((s, m) for m, s in members.items())]


class Model:
    """asynq's Redis state as plain Python, changed exactly as each operation should."""

    def __init__(self) -> None:
        self.queues: dict[str, ModelQueue] = {q: ModelQueue() for q in QUEUES}
        self.registered: set[str] = set()
        self.tasks: dict[Key, ModelTask] = {}
        self.locks: dict[str, str] = {}  # unique key -> owner id
        self.daily: dict[str, list[int]] = {}  # counter key -> [value, expireat]
        self.waiters: dict[str, list[str]] = {q: [] for q in QUEUES}  # index 0 = head
        self.credit: dict[str, int] = {}  # server -> its delivery credit (the key exists)

    # -- helpers -------------------------------------------------------------------------

    def count(self, q: str, now: float, *, failed: bool) -> None:
        when = datetime.fromtimestamp(now, UTC)
        names = [keys.processed_key(q, when)]
        if failed:
            names.append(keys.failed_key(q, when))
        for name in names:
            entry = self.daily.get(name)
            if entry is None:
                self.daily[name] = [1, int(now) + STATS_TTL]
            else:
                entry[0] += 1
        mq = self.queues[q]
        mq.processed += 1
        if failed:
            mq.failed += 1

    def release(self, ukey: str, tid: str) -> None:
        if ukey and self.locks.get(ukey) == tid:
            del self.locks[ukey]

    def leave_state(self, q: str, tid: str) -> None:
        """Take a non-active task out of its list, zset or group."""
        task = self.tasks[(q, tid)]
        mq = self.queues[q]
        if task.state == "pending":
            mq.pending = [i for i in mq.pending if i != tid]
        elif task.state == "aggregating":
            group = task.fields["group"].decode()
            del mq.g[group][tid]
            if not mq.g[group]:
                del mq.g[group]
                mq.groups.discard(group)
        else:
            del mq.z[task.state][tid]

    def staged(self, q: str, tid: str) -> bool:
        """An aggregating task staged in an aggregation set (not in its group zset)."""
        return any(tid in members for members in self.queues[q].sets.values())

    # -- the whole database ----------------------------------------------------------------

    def expected(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every key with (type, value), and each key's expected expiry: a unix time
        (exact), or ("within", seconds): present, and at most that many real seconds away."""
        out: dict[str, Any] = {}
        ttl: dict[str, Any] = {}
        if self.registered:
            out[keys.ALL_QUEUES] = ("set", {q.encode() for q in self.registered})
        for (q, tid), task in self.tasks.items():
            out[keys.task_key(q, tid)] = ("hash", task.hash())
        for ukey, owner in self.locks.items():
            out[ukey] = ("string", owner.encode())
            ttl[ukey] = ("within", LOCK_TTL)
        for server, credit in self.credit.items():
            name = keys.delivery_channel(server)
            out[name] = ("string", str(credit).encode())
            ttl[name] = ("within", CREDIT_TTL)
        for q, members in self.waiters.items():
            if members:
                out[keys.waiters_key(q)] = ("list", [w.encode() for w in members])
                ttl[keys.waiters_key(q)] = ("within", int(WAITERS_TTL))
        for name, (value, exp) in self.daily.items():
            out[name] = ("string", str(value).encode())
            ttl[name] = exp
        for q, mq in self.queues.items():
            p = keys.queue_key_prefix(q)
            for name, items in (("pending", mq.pending), ("active", mq.active)):
                if items:
                    out[p + name] = ("list", [i.encode() for i in items])
            zsets = {"lease": mq.lease, **mq.z, "aggregation_sets": mq.agg}
            zsets.update({"g:" + g: members for g, members in mq.g.items()})
            for skey, members in mq.sets.items():
                zsets[skey[len(p) :]] = members
            for name, members in zsets.items():
                if members:
                    out[p + name] = ("zset", {m.encode(): float(s) for m, s in members.items()})
            if mq.groups:
                out[p + "groups"] = ("set", {g.encode() for g in mq.groups})
            if mq.paused is not None:
                out[p + "paused"] = ("string", str(mq.paused).encode())
            if mq.limit is not None:
                out[keys.limit_key(q)] = ("string", str(mq.limit).encode())
            if mq.ordered:
                out[keys.ordered_key(q)] = ("string", b"1")
            if mq.processed:
                out[p + "processed"] = ("string", str(mq.processed).encode())
            if mq.failed:
                out[p + "failed"] = ("string", str(mq.failed).encode())
        return out, ttl


async def _actual(r: Redis) -> tuple[dict[str, Any], dict[str, int]]:
    names = sorted(k.decode() for k in await r.keys("*"))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    kinds = [k.decode() for k in await pipe.execute()]
    pipe = r.pipeline(transaction=False)
    for name, kind in zip(names, kinds, strict=True):
        if kind == "string":
            pipe.get(name)
        elif kind == "hash":
            pipe.hgetall(name)
        elif kind == "list":
            pipe.lrange(name, 0, -1)
        elif kind == "zset":
            pipe.zrange(name, 0, -1, withscores=True)
        elif kind == "set":
            pipe.smembers(name)
        else:  # pragma: no cover - the broker writes nothing else
            raise AssertionError(f"unexpected type {kind} for {name}")
        pipe.execute_command("EXPIRETIME", name)
    replies = await pipe.execute()
    out: dict[str, Any] = {}
    ttl: dict[str, int] = {}
    for n, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        value = replies[2 * n]
        if kind == "zset":
            value = dict(value)
        out[name] = (kind, value)
        ttl[name] = int(replies[2 * n + 1])
    return out, ttl


class TaskStateMachine(RuleBasedStateMachine):
    """Producers, workers and the Inspector against the model; see the module docstring."""

    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.clock = FakeClock(float(int(time.time())))
        self.model = Model()
        self.hand: dict[Key, TaskMessage] = {}  # what workers hold (may be stale)
        self.agg_seq = 0
        self.r: Redis = self.run(self._connect())
        self.broker = Broker(self.r, clock=self.clock)
        self.multi = MultiQueue(self.broker)
        self.inspector = Inspector(self.r, clock=self.clock)
        self.listening: dict[str, PubSub] = {}  # idle servers whose delivery channel is read

    async def _connect(self) -> Redis:
        r = Redis.from_url(self.redis_url)
        await r.flushdb()
        return r

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    def teardown(self) -> None:
        for pubsub in self.listening.values():  # confirmed: the next example starts unheard
            self.run(self.unsubscribe(pubsub))
        self.run(self.r.aclose())
        self.runner.close()

    def outcome(self, coro: Any) -> tuple[Any, BaseException | None]:
        try:
            return self.run(coro), None
        except (BrokerError, TaskIdConflictError, DuplicateTaskError, TaskNotFoundError,
                FailedPreconditionError, QueueNotFoundError) as exc:  # fmt: skip
            return None, exc

    @staticmethod
    def check_error(got: BaseException | None, want: type[BaseException] | None) -> None:
        if want is None:
            assert got is None, f"unexpected {got!r}"
        else:
            assert isinstance(got, want), f"expected {want.__name__}, got {got!r}"

    @property
    def now(self) -> float:
        return self.clock.now

    @initialize()
    def start(self) -> None:
        self.compare()

    @invariant()
    def compare(self) -> None:
        got, got_ttl = self.run(_actual(self.r))
        want, want_ttl = self.model.expected()
        assert got == want
        real = int(time.time())
        for name, exp in got_ttl.items():
            spec = want_ttl.get(name)
            if spec is None:
                assert exp == -1, f"{name} has an expiry ({exp}); the model has none"
            elif isinstance(spec, tuple):
                assert real - 1 <= exp <= real + spec[1] + 1, (name, exp, real)
            else:
                assert exp == spec, (name, exp, spec)

    # -- time ------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 30, 31, 61, 125]))  # 30: the lease, 125: a set's deadline
    def advance(self, seconds: int) -> None:
        self.clock.now += seconds

    @precondition(
        lambda self: any(
            s > self.now for mq in self.model.queues.values() for s in mq.lease.values()
        )
    )
    @rule()
    def advance_to_lease_expiry(self) -> None:
        """To the second the next lease expires: the boundary of every lease comparison."""
        self.clock.now = float(
            min(s for mq in self.model.queues.values() for s in mq.lease.values() if s > self.now)
        )

    # -- producer --------------------------------------------------------------------------

    def message(self, q: str, tid: str, ttype: str, payload: bytes, **fields: Any) -> TaskMessage:
        fields.setdefault("retry", 1)
        return TaskMessage(type=ttype, payload=payload, id=tid, queue=q, timeout=1800, **fields)

    def model_write(
        self, q: str, tid: str, kind: str, msg: TaskMessage, at: int, group: str
    ) -> type[BaseException] | None:
        """What one enqueue-like write does to the model, and the error it raises."""
        m = self.model
        m.registered.add(q)
        unique = kind.endswith("unique")
        if unique:
            if msg.unique_key in m.locks:
                return DuplicateTaskError
            m.locks[msg.unique_key] = tid  # kept even when the id conflicts (asynq)
        if (q, tid) in m.tasks:
            return TaskIdConflictError
        mq = m.queues[q]
        now_s, now_ns = int(self.now), int(self.now * NS)
        if kind.startswith("schedule"):
            task = ModelTask(msg, "scheduled")
            mq.z["scheduled"][tid] = at
        elif kind.startswith("group"):
            task = ModelTask(msg, "aggregating", {"group": group.encode()})
            mq.g.setdefault(group, {})[tid] = now_s
            mq.groups.add(group)
        elif kind == "plain" and self.deliver(q, tid, msg):
            return None
        else:
            task = ModelTask(msg, "pending", {"pending_since": str(now_ns).encode()})
            mq.pending.insert(0, tid)
        if unique and not kind.startswith("group"):  # AddToGroupUnique writes no field
            task.fields["unique_key"] = msg.unique_key.encode()
        m.tasks[(q, tid)] = task
        return None

    def deliver(self, q: str, tid: str, msg: TaskMessage) -> bool:
        """enqueue.lua's direct delivery: the waiter the model picks must be the one whose
        channel received the task. False: nobody could take it, it goes pending."""
        m = self.model
        mq, members = m.queues[q], m.waiters[q]
        if mq.pending or mq.paused is not None or self.room(mq, 1) <= 0:
            return False  # tasks wait already, or a fetch would not take it now
        for _ in range(min(len(members), 4)):  # the script looks at 4 waiters at most
            member = members.pop()  # the longest waiting goes to the head
            members.insert(0, member)
            server = member.rsplit(":", 1)[1]
            if server not in m.credit:  # a departed server: dropped
                members[:] = [w for w in members if w != member]
            elif m.credit[server] > 0:
                if server not in self.listening:  # nobody subscribed to its channel
                    del m.credit[server]
                    continue
                m.credit[server] -= 1
                note = parse_note(self.run(self.next_note(server)))
                assert (note.queue, note.task_id) == (q, tid)
                assert note.data == encode_task_message(msg)
                # The lease runs from the enqueuer's clock (the test's), as a dequeue's does.
                assert note.lease_expiry == int(self.now) + LEASE
                assert self.run(self.r.zscore(keys.lease_key(q), tid)) == note.lease_expiry
                mq.active.insert(0, tid)
                mq.lease[tid] = int(self.now + LEASE)
                m.tasks[(q, tid)] = ModelTask(msg, "active")
                self.hand[(q, tid)] = msg
                event("delivered")
                return True
        return False

    async def next_note(self, server: str) -> bytes:
        pubsub = self.listening[server]
        while (got := await pubsub.get_message(timeout=5.0)) is not None:
            if got["type"] == "message":
                return bytes(got["data"])
        raise AssertionError(f"no delivery note reached {server}")

    def plan(
        self,
        q: str,
        tid: str,
        kind: str,
        ttype: str,
        payload: bytes,
        delay: int,
        retention: int,
        retry: int,
        group: str,
    ) -> tuple[BatchItem | PendingItem, TaskMessage, int]:
        fields: dict[str, Any] = {"retention": retention, "retry": retry}
        if kind.endswith("unique"):
            fields["unique_key"] = keys.unique_key(q, ttype, payload)
        if kind.startswith("group") or (kind.startswith("schedule") and delay % 2):
            fields["group_key"] = group  # a scheduled task's group_key is only in its msg
        msg = self.message(q, tid, ttype, payload, **fields)
        at = self.clock.dt + timedelta(seconds=delay)
        ttl = LOCK_TTL if kind.endswith("unique") else None
        item: BatchItem | PendingItem
        if kind == "pending_item":
            item = PendingItem(q, tid, encode_task_message(msg))
        elif kind.startswith("schedule"):
            item = BatchItem(msg, process_at=at, unique_ttl=ttl)
        elif kind.startswith("group"):
            item = BatchItem(msg, group=group, unique_ttl=ttl)
        else:
            item = BatchItem(msg, unique_ttl=ttl)
        return item, msg, int(self.now) + delay

    @rule(
        q=st.sampled_from(QUEUES),
        tid=st.sampled_from(IDS),
        kind=st.sampled_from(
            [
                "plain",
                "plain",
                "plain",
                "unique",
                "schedule",
                "schedule_unique",
                "group",
                "group_unique",
            ]
        ),
        ttype=st.sampled_from(TYPES),
        payload=st.sampled_from(PAYLOADS),
        delay=st.integers(-5, 90),
        retention=st.sampled_from([0, 0, 45]),
        retry=st.integers(0, 2),
        group=st.sampled_from(GROUPS),
    )
    def enqueue(self, q: str, tid: str, kind: str, ttype: str, payload: bytes, delay: int,
                retention: int, retry: int, group: str) -> None:  # fmt: skip
        item, msg, at = self.plan(q, tid, kind, ttype, payload, delay, retention, retry, group)
        assert isinstance(item, BatchItem)
        _, err = self.outcome(self.broker.write(item))
        self.check_error(err, self.model_write(q, tid, kind, msg, at, group))

    @rule(
        items=st.lists(
            st.tuples(
                st.sampled_from(QUEUES),
                st.sampled_from(IDS),
                st.sampled_from(
                    ["pending_item", "pending_item", "plain", "unique", "schedule", "group"]
                ),
                st.sampled_from(TYPES),
                st.sampled_from(PAYLOADS),
                st.integers(-5, 90),
            ),
            min_size=1,
            max_size=5,
        )
    )
    def enqueue_many(self, items: list[tuple[str, str, str, str, bytes, int]]) -> None:
        planned = [
            (self.plan(q, tid, kind, ttype, payload, delay, 0, 1, "g1"), q, tid, kind)
            for q, tid, kind, ttype, payload, delay in items
        ]
        results = self.run(self.broker.enqueue_batch([p[0][0] for p in planned]))
        for ((_, msg, at), q, tid, kind), got in zip(planned, results, strict=True):
            self.check_error(got, self.model_write(q, tid, kind, msg, at, "g1"))

    @precondition(lambda self: self.model.locks)
    @rule(pick=st.integers(0, 1 << 16))
    def lock_expires(self, pick: int) -> None:
        """A unique lock's TTL runs out (simulated: its TTL is in real time)."""
        names = sorted(self.model.locks)
        name = names[pick % len(names)]
        self.run(self.r.delete(name))
        del self.model.locks[name]

    # -- worker: direct delivery -------------------------------------------------------------

    async def subscribe(self, server: str) -> PubSub:
        pubsub = self.r.pubsub()
        await pubsub.subscribe(keys.delivery_channel(server))
        confirmed = await pubsub.get_message(timeout=5.0)  # Redis has it before any PUBLISH
        assert confirmed is not None and confirmed["type"] == "subscribe", confirmed
        return pubsub

    async def unsubscribe(self, pubsub: PubSub) -> None:
        await pubsub.unsubscribe()
        confirmed = await pubsub.get_message(timeout=5.0)  # every note was read by its enqueue
        assert confirmed is not None and confirmed["type"] == "unsubscribe", confirmed
        await pubsub.aclose()

    @rule(server=st.sampled_from(SERVERS), on=st.booleans())
    def listen(self, server: str, on: bool) -> None:
        """A server's subscriber reads its delivery channel, or it has gone away."""
        if on and server not in self.listening:
            self.listening[server] = self.run(self.subscribe(server))
        elif not on and server in self.listening:
            self.run(self.unsubscribe(self.listening.pop(server)))

    @rule(
        server=st.sampled_from(SERVERS),
        qs=st.lists(st.sampled_from(QUEUES), unique=True, max_size=3),
        listen=st.sampled_from([True, True, False]),
    )
    def arm(self, server: str, qs: list[str], listen: bool) -> None:
        """An idle server asks to be delivered its next task (no queues: renews its credit)."""
        if listen:
            self.listen(server, True)
        got = self.run(self.broker.arm_delivery(server, CREDIT_TTL, qs))
        m = self.model
        assert got == (server in m.credit or bool(qs))
        if got:
            m.credit[server] = 1
        member = self.broker.delivery_member(server)
        for q in qs:
            m.waiters[q] = [member, *(w for w in m.waiters[q] if w != member)]

    @rule(
        server=st.sampled_from(SERVERS),
        qs=st.lists(st.sampled_from(QUEUES), unique=True, max_size=3),
    )
    def disarm(self, server: str, qs: list[str]) -> None:
        """A server stops: it leaves the waiters lists it names and drops its credit."""
        self.run(self.broker.disarm_delivery(server, qs))
        member = self.broker.delivery_member(server)
        self.model.credit.pop(server, None)
        for q in qs:
            self.model.waiters[q] = [w for w in self.model.waiters[q] if w != member]

    @rule(
        server=st.sampled_from(SERVERS),
        q=st.sampled_from(QUEUES),
        tid=st.sampled_from(IDS),
        hold=st.sampled_from([None, None, "pause", "limit", "ordered"]),
    )
    def enqueue_to_idle(self, server: str, q: str, tid: str, hold: str | None) -> None:
        """A server waits on q (q perhaps paused, limited or ordered) and a task comes."""
        self.arm(server, [q], True)
        mq = self.model.queues[q]
        if hold == "pause" and mq.paused is None and q in self.model.registered:
            self.pause_or_resume(q)
        elif hold in ("limit", "ordered"):
            self.flow_control(q, 1 if hold == "limit" else None, hold == "ordered")
        self.enqueue_pending(q, tid, 0, 1, False)

    @precondition(lambda self: self.model.credit)
    @rule(server=st.sampled_from(SERVERS))
    def credit_expires(self, server: str) -> None:
        """A server stopped renewing its credit (simulated: the TTL is in real time)."""
        self.run(self.r.delete(keys.delivery_channel(server)))
        self.model.credit.pop(server, None)

    # -- worker: fetch -----------------------------------------------------------------------

    @rule(
        order=st.permutations(QUEUES).flatmap(
            lambda p: st.sampled_from([3, 3, 2, 1]).map(lambda n: p[:n])
        ),
        count=st.integers(1, 3),
        multi=st.booleans(),
    )
    def dequeue(self, order: list[str], count: int, multi: bool) -> None:
        if multi:
            got = self.run(self.multi.dequeue(order, count)).tasks
        else:
            got = self.run(transitions.dequeue_many(self.broker, order, count))
        m = self.model
        want: list[Key] = []
        for q in order:
            mq = m.queues[q]
            if mq.paused is not None or not mq.pending:
                continue
            room = count - len(want)
            if multi:  # the worker's script honours limits and ordered queues
                room = self.room(mq, room)
            while room > 0 and mq.pending:
                tid = mq.pending.pop()
                mq.active.insert(0, tid)
                mq.lease[tid] = int(self.now + LEASE)
                task = m.tasks[(q, tid)]
                task.state = "active"
                task.fields.pop("pending_since", None)
                want.append((q, tid))
                room -= 1
            if len(want) >= count:
                break
        assert [(t.message.queue, t.message.id) for t in got] == want
        for t, key in zip(got, want, strict=True):
            assert encode_task_message(t.message) == encode_task_message(m.tasks[key].msg)
            assert t.lease_expiry == self.now + LEASE
            self.hand[key] = t.message

    def room(self, mq: ModelQueue, want: int) -> int:
        """_lib/room.lua's rule, shared by a fetch and a delivery: how many of *want* tasks
        the queue may give now (a stored limit counts the live leases; an ordered queue
        gives one at a time, and none while it holds a retry)."""
        room = want
        if mq.limit is not None:
            live = sum(1 for s in mq.lease.values() if s >= int(self.now))
            room = min(room, mq.limit - live)
        if room > 0 and mq.ordered:
            room = 0 if mq.z["retry"] else min(room, 1 - len(mq.active))
        return room

    def held(self, pick: int) -> Key:
        names = sorted(self.hand)
        return names[pick % len(names)]

    def ack(self, picks: list[int], batch: bool) -> None:
        """Handlers succeeded: done (no retention) or completed (kept for the retention)."""
        chosen = [self.held(p) for p in picks]
        msgs = [self.hand[k] for k in chosen]
        if batch:
            results = self.run(self.broker.ack_many([(m, m.retention > 0) for m in msgs]))
        else:
            results = []
            for msg in msgs:
                call = self.broker.mark_as_complete if msg.retention > 0 else self.broker.done
                results.append(self.outcome(call(msg))[1])
        m = self.model
        now_s = int(self.now)
        for (q, tid), msg, got in zip(chosen, msgs, results, strict=True):
            mq = m.queues[q]
            if tid not in mq.active:
                self.check_error(got, TaskNotFoundError)
                continue
            self.check_error(got, None)
            mq.active.remove(tid)
            del mq.lease[tid]
            if msg.retention > 0:
                task = m.tasks[(q, tid)]
                task.msg = _copy(msg, completed_at=now_s)
                task.state = "completed"
                mq.z["completed"][tid] = now_s + msg.retention
            else:
                del m.tasks[(q, tid)]
            m.release(msg.unique_key, tid)
            m.count(q, self.now, failed=False)
            self.hand.pop((q, tid), None)

    def fail_model(self, key: Key, msg: TaskMessage, err: str, at: int | None, failure: bool
                   ) -> type[BaseException] | None:  # fmt: skip
        """Retry (*at* set) or archive an active task as the broker should."""
        m = self.model
        q, tid = key
        mq = m.queues[q]
        if tid not in mq.active:
            return TaskNotFoundError
        mq.active.remove(tid)
        del mq.lease[tid]
        task = m.tasks[key]
        now_s = int(self.now)
        if at is None:
            task.msg = _copy(msg, error_msg=err, last_failed_at=now_s)
            task.state = "archived"
            mq.z["archived"][tid] = now_s
            m.count(q, self.now, failed=True)
        else:
            retried = msg.retried + 1 if failure else msg.retried
            task.msg = _copy(msg, retried=retried, error_msg=err, last_failed_at=now_s)
            task.state = "retry"
            mq.z["retry"][tid] = at
            if failure:
                m.count(q, self.now, failed=True)
        return None

    def retry(self, pick: int, delay: int, failure: bool) -> None:
        key = self.held(pick)
        msg = self.hand[key]
        at = self.clock.dt + timedelta(seconds=delay)
        _, err = self.outcome(self.broker.retry(msg, at, "boom", is_failure=failure))
        self.check_error(err, self.fail_model(key, msg, "boom", int(self.now) + delay, failure))
        self.hand.pop(key, None)

    def archive(self, pick: int) -> None:
        key = self.held(pick)
        msg = self.hand[key]
        _, err = self.outcome(self.broker.archive(msg, "gave up"))
        self.check_error(err, self.fail_model(key, msg, "gave up", None, True))
        self.hand.pop(key, None)

    def requeue(self, pick: int) -> None:
        """Shutdown: the task goes back to the end of pending that is taken next."""
        key = self.held(pick)
        _, err = self.outcome(self.broker.requeue(self.hand.pop(key)))
        q, tid = key
        mq = self.model.queues[q]
        if tid not in mq.active:
            self.check_error(err, TaskNotFoundError)
            return
        self.check_error(err, None)
        mq.active.remove(tid)
        del mq.lease[tid]
        mq.pending.append(tid)
        self.model.tasks[key].state = "pending"

    def extend_lease(self, pick: int) -> None:
        q, tid = self.held(pick)
        self.run(self.broker.extend_lease(q, [tid]))
        lease = self.model.queues[q].lease
        if tid in lease:  # ZADD XX: a lease that is gone stays gone
            lease[tid] = int(self.now + LEASE)

    def working(self) -> list[Key]:
        """Held tasks that are still active (a stale hand may point at a moved task)."""
        return sorted(k for k in self.hand if k[1] in self.model.queues[k[0]].active)

    def write_result(self, pick: int, data: bytes) -> None:
        keys_ = self.working()
        q, tid = keys_[pick % len(keys_)]
        assert self.run(self.broker.write_result(q, tid, data)) == len(data)
        self.model.tasks[(q, tid)].fields["result"] = data

    # -- worker: background roles ----------------------------------------------------------

    def recover(self, multi: bool, delay: int) -> None:
        """The recoverer: retry (or archive, retries used up) tasks whose lease expired."""
        cutoff = self.clock.dt
        if multi:
            found, _ = self.run(self.multi.scan_leases(cutoff, QUEUES))
        else:
            found = [
                (m.queue, m)
                for m in self.run(transitions.list_lease_expired(self.broker, cutoff, QUEUES))
            ]
        now_s = int(self.now)
        want = [
            (q, tid)
            for q in QUEUES
            for tid in _sorted_members(self.model.queues[q].lease)
            if self.model.queues[q].lease[tid] <= now_s
        ]
        assert [(q, msg.id) for q, msg in found] == want
        for q, msg in found:
            key = (q, msg.id)
            assert encode_task_message(msg) == encode_task_message(self.model.tasks[key].msg)
            err = "asynq: task lease expired"
            if msg.retried >= msg.retry:
                self.run(self.broker.archive(msg, err))
                assert self.fail_model(key, msg, err, None, True) is None
            else:
                at = self.clock.dt + timedelta(seconds=delay)
                self.run(self.broker.retry(msg, at, err, is_failure=True))
                assert self.fail_model(key, msg, err, now_s + delay, True) is None

    def forward(self, multi: bool) -> None:
        """The forwarder: due scheduled and retry tasks go to pending, or back to their group."""
        if multi:
            moved = self.run(self.multi.forward(QUEUES))
        else:
            moved = self.run(transitions.forward_if_ready(self.broker, QUEUES))
        m = self.model
        now_s, now_ns = int(self.now), int(self.now * NS)
        want = 0
        for q in QUEUES:
            mq = m.queues[q]
            for source in ("scheduled", "retry"):
                zset = mq.z[source]
                due = [tid for tid in _sorted_members(zset) if zset[tid] <= now_s]
                want += len(due)
                for tid in due:
                    task = m.tasks[(q, tid)]
                    del zset[tid]
                    group = task.fields.get("group", b"").decode()
                    if group:
                        mq.g.setdefault(group, {})[tid] = now_s
                        mq.groups.add(group)
                        task.state = "aggregating"
                    else:
                        if multi and mq.ordered and source == "retry":
                            mq.pending.append(tid)  # ordered: the failed task runs first
                        else:
                            mq.pending.insert(0, tid)
                        task.state = "pending"
                        task.fields["pending_since"] = str(now_ns).encode()
        assert moved == want

    def janitor(self) -> None:
        deleted = self.run(self.multi.delete_expired_completed(QUEUES))
        now_s = int(self.now)
        want = 0
        for q in QUEUES:
            completed = self.model.queues[q].z["completed"]
            for tid in [t for t, s in completed.items() if s <= now_s]:
                del completed[tid]
                del self.model.tasks[(q, tid)]
                want += 1
        assert deleted == want

    # -- aggregation -----------------------------------------------------------------------

    @rule(
        q=st.sampled_from(QUEUES),
        group=st.sampled_from(GROUPS),
        grace=st.sampled_from([0, 1, 5, 30]),
        max_delay=st.sampled_from([0, 30, 61]),
        max_size=st.sampled_from([0, 1, 2, 5]),
        finish=st.booleans(),
    )
    def aggregate(self, q: str, group: str, grace: int, max_delay: int, max_size: int,
                  finish: bool) -> None:  # fmt: skip
        """The aggregator's check; with *finish*, the aggregate is enqueued and the set dropped."""
        set_id = self.run(
            self.broker.aggregation_check(q, group, self.clock.dt, grace, max_delay, max_size)
        )
        mq = self.model.queues[q]
        members = mq.g.get(group, {})
        order = _sorted_members(members)
        now_s = int(self.now)
        size = len(order)
        stage: int | None = None
        # Staged when full, when the oldest waited max_delay, or the newest the grace period.
        if size and (
            (max_size and size >= max_size)
            or (max_delay and members[order[0]] <= now_s - max_delay)
            or members[order[-1]] <= now_s - grace
        ):
            stage = max_size
        if stage is None:
            assert set_id is None
            return
        assert set_id is not None
        taken = order[:stage] if stage else order
        skey = keys.aggregation_set_key(q, group, set_id)
        mq.sets[skey] = {tid: members.pop(tid) for tid in taken}
        mq.agg[skey] = now_s + AGGREGATION_TIMEOUT
        if not members:
            del mq.g[group]
        if max_size == 0 or size <= max_size:
            mq.groups.discard(group)
        if finish:
            self.finish_set(q, group, set_id)

    def finish_set(self, q: str, group: str, set_id: str) -> None:
        skey = keys.aggregation_set_key(q, group, set_id)
        mq = self.model.queues[q]
        msgs, deadline = self.run(self.broker.read_aggregation_set(q, group, set_id))
        assert [m.id for m in msgs] == _sorted_members(mq.sets[skey])
        assert int(deadline.timestamp()) == mq.agg[skey]
        self.agg_seq += 1
        agg = self.message(q, f"agg{self.agg_seq}", "batch", b"".join(m.payload for m in msgs))
        self.run(self.broker.enqueue(agg))
        assert self.model_write(q, agg.id, "plain", agg, 0, "") is None
        self.run(self.broker.delete_aggregation_set(q, group, set_id))
        for tid in mq.sets.pop(skey):
            del self.model.tasks[(q, tid)]
        del mq.agg[skey]

    @precondition(lambda self: any(mq.sets for mq in self.model.queues.values()))
    @rule(pick=st.integers(0, 1 << 16))
    def finish_staged(self, pick: int) -> None:
        staged = sorted((q, s) for q, mq in self.model.queues.items() for s in mq.sets)
        q, skey = staged[pick % len(staged)]
        group, set_id = skey[len(keys.group_key_prefix(q)) :].rsplit(":", 1)
        self.finish_set(q, group, set_id)

    def reclaim(self, multi: bool) -> None:
        """The recoverer: sets past their deadline go back into their group."""
        if multi:
            self.run(self.multi.reclaim_stale_aggregation_sets(QUEUES))
        else:
            for q in QUEUES:
                self.run(transitions.reclaim_stale_aggregation_sets(self.broker, q))
        now_s = int(self.now)
        for q in QUEUES:
            mq = self.model.queues[q]
            for skey in [s for s, d in mq.agg.items() if d <= now_s]:
                del mq.agg[skey]
                members = mq.sets.pop(skey)
                group = skey[len(keys.group_key_prefix(q)) :].rsplit(":", 1)[0]
                if members:
                    mq.g.setdefault(group, {}).update(members)
                    mq.groups.add(group)

    # -- Inspector -------------------------------------------------------------------------

    def target(self, q: str, pick: int) -> str:
        """An id of *q*: an existing task most of the time, else one that may not exist."""
        ids = sorted(tid for (tq, tid) in self.model.tasks if tq == q)
        if ids and pick % 5:
            return ids[pick % len(ids)]
        return IDS[pick % len(IDS)]

    def inspect_model(self, q: str, tid: str, op: str) -> type[BaseException] | None:
        m = self.model
        if q not in m.registered:
            return QueueNotFoundError
        task = m.tasks.get((q, tid))
        if task is None:
            return TaskNotFoundError
        if task.state == "active":
            return FailedPreconditionError
        if op == "run" and task.state == "pending":
            return FailedPreconditionError
        if op == "archive" and task.state == "archived":
            return FailedPreconditionError
        if task.state == "aggregating" and m.staged(q, tid):
            return BrokerError  # staged for aggregation: not in its group zset
        return None

    def inspector_delete(self, q: str, pick: int) -> None:
        tid = self.target(q, pick)
        _, err = self.outcome(self.inspector.delete_task(q, tid))
        want = self.inspect_model(q, tid, "delete")
        self.check_error(err, want)
        if want is None:
            self.model.leave_state(q, tid)
            task = self.model.tasks.pop((q, tid))
            self.model.release(task.fields.get("unique_key", b"").decode(), tid)

    def inspector_run(self, q: str, pick: int) -> None:
        tid = self.target(q, pick)
        _, err = self.outcome(self.inspector.run_task(q, tid))
        want = self.inspect_model(q, tid, "run")
        self.check_error(err, want)
        if want is None:
            self.model.leave_state(q, tid)
            self.model.queues[q].pending.insert(0, tid)
            task = self.model.tasks[(q, tid)]
            task.state = "pending"
            task.fields["pending_since"] = str(int(self.now * NS)).encode()

    def inspector_archive(self, q: str, pick: int) -> None:
        tid = self.target(q, pick)
        _, err = self.outcome(self.inspector.archive_task(q, tid))
        want = self.inspect_model(q, tid, "archive")
        self.check_error(err, want)
        if want is None:
            self.model.leave_state(q, tid)
            self.model.queues[q].z["archived"][tid] = int(self.now)
            self.model.tasks[(q, tid)].state = "archived"

    def pause_or_resume(self, q: str) -> None:
        mq = self.model.queues[q]
        registered = q in self.model.registered
        if mq.paused is None:
            _, err = self.outcome(self.inspector.pause(q))
            if registered:
                mq.paused = int(self.now)
        else:
            _, err = self.outcome(self.inspector.resume(q))
            if registered:
                mq.paused = None
        self.check_error(err, None if registered else QueueNotFoundError)

    def flow_control(self, q: str, limit: int | None, ordered: bool) -> None:
        """A fleet-wide concurrency limit and the ordered flag, as the Inspector stores them.

        The queue need not exist yet: the settings are stored before its first task, and
        the queue is not registered by them.
        """
        _, err = self.outcome(self.inspector.set_limit(q, limit))
        self.check_error(err, None)
        _, err = self.outcome(self.inspector.set_ordered(q, ordered))
        self.check_error(err, None)
        self.model.queues[q].limit = limit
        self.model.queues[q].ordered = ordered

    # -- dispatch: one rule per actor, so the lifecycle is not drowned by rarer steps ------

    @precondition(lambda self: self.hand)
    @rule(
        how=st.sampled_from(
            ["ack", "ack", "ack", "retry", "retry", "archive", "requeue", "extend", "result"]
        ),
        picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=3),
        batch=st.booleans(),
        delay=st.integers(0, 90),
        failure=st.booleans(),
        data=st.sampled_from([b"", b"ok", b"\xff"]),
    )
    def work(self, how: str, picks: list[int], batch: bool, delay: int, failure: bool,
             data: bytes) -> None:  # fmt: skip
        """A worker finishes (or touches) tasks it holds."""
        if how == "ack":
            self.ack(picks, batch)
        elif how == "retry":
            self.retry(picks[0], delay, failure)
        elif how == "archive":
            self.archive(picks[0])
        elif how == "requeue":
            self.requeue(picks[0])
        elif how == "extend":
            self.extend_lease(picks[0])
        elif self.working():
            self.write_result(picks[0], data)

    @rule(
        which=st.sampled_from(["forward", "forward", "recover", "janitor", "reclaim"]),
        multi=st.booleans(),
        delay=st.integers(0, 60),
    )
    def housekeeping(self, which: str, multi: bool, delay: int) -> None:
        """The forwarder, recoverer and janitor of some worker."""
        if which == "forward":
            self.forward(multi)
        elif which == "recover":
            self.recover(multi, delay)
        elif which == "janitor":
            self.janitor()
        else:
            self.reclaim(multi)

    @rule(
        op=st.sampled_from(["delete", "run", "archive"]),
        q=st.sampled_from(QUEUES),
        pick=st.integers(0, 1 << 16),
    )
    def inspect(self, op: str, q: str, pick: int) -> None:
        """A user acts on one task from the Inspector (CLI, web UI)."""
        getattr(self, f"inspector_{op}")(q, pick)

    @rule(
        op=st.sampled_from(["run", "archive", "delete"]),
        q=st.sampled_from(QUEUES),
        pick=st.integers(0, 1 << 16),
    )
    def inspect_bulk(self, op: str, q: str, pick: int) -> None:
        """run_all, archive_all or delete_all over one sorted-set state of a queue."""
        states = {
            "run": ("scheduled", "retry", "archived"),
            "archive": ("scheduled", "retry"),
            "delete": ("scheduled", "retry", "archived", "completed"),
        }[op]
        state = states[pick % len(states)]
        call = getattr(self.inspector, f"{op}_all")
        got, err = self.outcome(call(q, state))
        m = self.model
        if q not in m.registered:
            self.check_error(err, QueueNotFoundError)
            return
        self.check_error(err, None)
        zset = m.queues[q].z[state]
        ids = _sorted_members(zset)
        assert got == len(ids)
        zset.clear()
        now_s, now_ns = int(self.now), int(self.now * NS)
        for tid in ids:
            task = m.tasks[(q, tid)]
            if op == "run":
                m.queues[q].pending.insert(0, tid)
                task.state = "pending"
                task.fields["pending_since"] = str(now_ns).encode()
            elif op == "archive":
                m.queues[q].z["archived"][tid] = now_s
                task.state = "archived"
            else:
                m.release(task.fields.get("unique_key", b"").decode(), tid)
                del m.tasks[(q, tid)]

    @rule(
        q=st.sampled_from(QUEUES),
        pause=st.sampled_from([False, False, False, True]),
        limit=st.sampled_from([None, None, 0, 1, 2]),
        ordered=st.booleans(),
    )
    def admin(self, q: str, pause: bool, limit: int | None, ordered: bool) -> None:
        """A user pauses/resumes a queue, or sets its limit and ordered flag."""
        if pause:
            self.pause_or_resume(q)
        else:
            self.flow_control(q, limit, ordered)

    # The lifecycle's rules carry more weight: hypothesis picks among rules evenly.

    @rule(
        q=st.sampled_from(QUEUES),
        tid=st.sampled_from(IDS),
        retention=st.sampled_from([0, 0, 45]),
        retry=st.integers(0, 2),
        unique=st.booleans(),
    )
    def enqueue_pending(self, q: str, tid: str, retention: int, retry: int, unique: bool) -> None:
        """A pending task (its own unique key: the payload is its id)."""
        kind = "unique" if unique else "plain"
        self.enqueue(q, tid, kind, "email", tid.encode(), 0, retention, retry, "g1")

    @rule(order=st.permutations(QUEUES), count=st.integers(1, 3), multi=st.booleans())
    def dequeue_all(self, order: list[str], count: int, multi: bool) -> None:
        self.dequeue(order, count, multi)

    @rule(multi=st.booleans(), delay=st.sampled_from([0, 5, 30]))
    def recover_expired(self, multi: bool, delay: int) -> None:
        self.recover(multi, delay)

    @precondition(lambda self: self.hand)
    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=3), batch=st.booleans())
    def ack_held(self, picks: list[int], batch: bool) -> None:
        self.ack(picks, batch)

    @precondition(lambda self: self.hand)
    @rule(
        pick=st.integers(0, 1 << 16),
        delay=st.sampled_from([0, 0, 1, 5, 30, 90]),
        failure=st.booleans(),
    )
    def fail_held(self, pick: int, delay: int, failure: bool) -> None:
        """The processor's choice: retry while retries are left (or not a failure), else archive."""
        msg = self.hand[self.held(pick)]
        if failure and msg.retried >= msg.retry:
            self.archive(pick)
        else:
            self.retry(pick, delay, failure)


def model_settings() -> settings:
    """The current profile's settings (conftest: derandomized by default, ``fuzz`` in nox)."""
    fuzz = settings.get_current_profile_name() == "fuzz"
    return settings(
        max_examples=400 if fuzz else 100,
        stateful_step_count=60 if fuzz else 50,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


# A hang guard, not a speed bound: about 30 s alone, several times that beside CPU hogs.
@pytest.mark.timeout(900)
def test_state_machine_matches_model(redis_url: str) -> None:
    TaskStateMachine.redis_url = redis_url
    run_state_machine_as_test(TaskStateMachine, settings=model_settings())
