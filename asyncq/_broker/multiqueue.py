"""Broker operations over many queues at once: one script call per Redis node.

asynq's per-queue scripts cost one round trip per queue (asyncq keeps them in
its tests only, as the reference these are checked against), so a worker
serving a thousand queues paid a thousand calls per fetch and per forwarder,
recoverer and janitor pass, even with every queue empty.
:class:`MultiQueue` runs the same transitions (same keys, same fields, same
scores as asynq's scripts, so Go servers sharing the Redis see nothing new)
for a whole list of queues in one script call:

* ``dequeue`` (``dequeue_queues.lua``) tries the queues in the given order and
  skips empty and paused ones inside Redis, at the cost of one LLEN each; it
  also reports which queues it found empty, and can stop before a byte budget.
* ``forward`` (``forward_queues.lua``), ``scan_leases``,
  ``delete_expired_completed`` and ``reclaim_stale_aggregation_sets`` batch
  the forwarder's, recoverer's and janitor's work the same way. Like the
  dequeue, each first probes the sets it reads with one EXISTS per 200 queues
  and skips the chunks where none exists, so over a thousand idle queues a
  pass is a handful of commands inside Redis instead of one or two per queue.

On Redis Cluster each queue's keys share the ``{queue}`` hash tag, so queues
live in different slots and often on different nodes. The queues are grouped
by the node that serves them and each group goes to its node in one call,
using Redis 7's ``allow-cross-slot-keys`` script flag (all keys of one call
are on that node). A dequeue keeps the order: in strict order each run of
consecutive queues on one node is one call, tried run after run; in weighted
(shuffled) order each node's queues keep their relative order and the nodes
are tried in the order their first queue appears.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import LUA_PACKAGE, BrokerBase, as_text, script_error, usable_message
from asyncq._broker.processing import DequeuedTask
from asyncq._logging import RateLimiter, error_text
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._redis.scripts import Script, load_script
from asyncq._time import to_unix
from asyncq.proto.asynq import TaskMessage

__all__ = ["FORWARD_BATCH", "FetchResult", "MultiQueue"]

FORWARD_BATCH = 100
"""Due ids moved per scheduled/retry set and call (asynq's ForwardIfReady batch)."""

_CROSS_SLOT = "#!lua flags=allow-cross-slot-keys\n"
_PROBE_CHUNK = 200
"""Queues whose keys one EXISTS probes inside the multi-queue scripts."""


def _multi_script(name: str) -> tuple[Script, Script]:
    """The script for a single server, and its cluster variant (Redis >= 7).

    The scripts take queue names in ARGV and build asynq's keys from them. On a
    cluster a call declares one key of its node (that routes it) and carries
    the allow-cross-slot-keys flag, since its queues live in different slots.
    """
    source = load_script(LUA_PACKAGE, name).source
    return Script(name, source), Script(name, _CROSS_SLOT + source)


_DEQUEUE = _multi_script("dequeue_queues")
_FORWARD = _multi_script("forward_queues")
_LIST_LEASE_EXPIRED = _multi_script("list_lease_expired_queues")
_DELETE_EXPIRED_COMPLETED = _multi_script("delete_expired_completed_queues")
_RECLAIM = _multi_script("reclaim_stale_aggregation_sets_queues")

_log = structlog.get_logger("asyncq")


@dataclass(slots=True)
class FetchResult:
    """What one multi-queue dequeue took, and the queues it found empty or paused."""

    tasks: list[DequeuedTask]
    empty: set[str]
    held: set[str] = field(default_factory=set)
    """Queues with pending work that a concurrency or rate limit kept from giving (more) tasks."""


def _probe(node: ClusterNode | None) -> int:
    """Queues per EXISTS probe: one on a cluster, where a command cannot span slots."""
    return 1 if node is not None else _PROBE_CHUNK


def _limit_spec(names: Sequence[str], limits: Mapping[str, tuple[int, ...]] | None) -> str:
    """``pos:fleet:local[:interval:burst];...`` for the limited *names* (dequeue_queues.lua)."""
    if not limits:
        return ""
    parts = []
    for pos, name in enumerate(names, 1):
        limit = limits.get(name)
        if limit is not None:
            parts.append(":".join([str(pos), *map(str, limit)]))
    return ";".join(parts)


class MultiQueue:
    """Multi-queue script calls on a broker's connection; see the module docstring.

    Part of the broker's implementation: the worker calls these through the
    ``Broker`` methods (``fetch``, ``forward_queues``, ``scan_leases``, ...).
    """

    __slots__ = ("_broker", "_checked", "_cluster", "_damaged", "_errors", "_slots")

    def __init__(self, broker: BrokerBase) -> None:
        self._broker = broker
        redis = broker.redis
        self._cluster: RedisCluster | None = redis if isinstance(redis, RedisCluster) else None
        self._slots: dict[str, int] = {}
        self._checked: set[str] = set()
        self._errors = RateLimiter(3.0)
        self._damaged: dict[str, RateLimiter] = {}

    def _skipped(self, operation: str, problems: Sequence[Any]) -> None:
        """Log the damaged keys a multi-queue script skipped, at most once per 3 s per
        *operation*: the other queues of the call were handled."""
        if not problems:
            return
        limiter = self._damaged.get(operation)
        if limiter is None:
            limiter = self._damaged[operation] = RateLimiter(3.0)
        if limiter.allow():
            texts = [as_text(p) for p in problems]
            _log.warning(
                f"{operation}: skipped damaged keys; the other queues were handled",
                key=texts[0].removeprefix("WRONGTYPE ").split(" is not a ")[0].split(" holds ")[0],
                problems=texts,
                suppressed_since_last=limiter.take_suppressed(),
            )

    # -- routing ------------------------------------------------------------------------

    async def _groups(
        self, qnames: Sequence[str], *, runs: bool
    ) -> list[tuple[ClusterNode | None, list[str]]]:
        """The queues grouped per node (one group without a cluster); order kept per group.

        With *runs*, only consecutive queues on the same node share a group
        (strict order); otherwise a node's queues form one group, the groups
        ordered by their first queue.
        """
        names = list(qnames)
        for name in names:
            if name not in self._checked:
                self._broker._q(name)  # validates the name
                self._checked.add(name)
        cluster = self._cluster
        if cluster is None:
            return [(None, names)] if names else []
        await cluster.initialize()  # loads the slot map once; a no-op afterwards
        manager = cluster.nodes_manager
        groups: list[tuple[ClusterNode | None, list[str]]] = []
        by_node: dict[str, list[str]] = {}
        for name in names:
            slot = self._slots.get(name)
            if slot is None:
                slot = self._slots[name] = cluster.keyslot(keys.pending_key(name))
            node = manager.get_node_from_slot(slot)
            if runs:
                if groups and groups[-1][0] == node:
                    groups[-1][1].append(name)
                else:
                    groups.append((node, [name]))
            else:
                members = by_node.get(node.name)
                if members is None:
                    members = by_node[node.name] = []
                    groups.append((node, members))
                members.append(name)
        return groups

    async def _call(
        self,
        scripts: tuple[Script, Script],
        node: ClusterNode | None,
        names: Sequence[str],
        args: Sequence[Any],
    ) -> Any:
        """Run a multi-queue script with *args* followed by the queue *names*."""
        script, variant = scripts
        try:
            if node is None:
                return await script(self._broker._cmd, (), (*args, *names))
            cluster = self._cluster
            assert cluster is not None
            # One key of the node routes the call; the queues' keys are built in Lua.
            route = keys.pending_key(names[0])
            command = ("EVALSHA", variant.sha, 1, route, *args, *names)
            try:
                return await cluster.execute_command(*command, target_nodes=node)
            except NoScriptError:
                await cluster.execute_command("SCRIPT LOAD", variant.source, target_nodes=node)
                return await cluster.execute_command(*command, target_nodes=node)
        except ResponseError as exc:
            raise script_error(exc, script, names[0] if names else "", "") from exc

    # -- dequeue -------------------------------------------------------------------------

    async def dequeue(
        self,
        qnames: Sequence[str],
        count: int,
        *,
        strict: bool = False,
        max_bytes: int | None = None,
        first_free: bool = True,
        limits: Mapping[str, tuple[int, ...]] | None = None,
    ) -> FetchResult:
        """Take up to *count* tasks from *qnames*, tried in order, in one call per node group.

        *max_bytes* bounds the stored message bytes taken (None: no bound);
        with *first_free* the first task is taken even when it alone exceeds
        the bound. A message that cannot be decoded, or that names another
        queue, is archived instead of returned. When a later call fails after
        tasks were taken, those tasks are returned (and the failure logged);
        with nothing taken the error is raised.

        *limits* maps a queue to ``(fleet, local)``: *fleet* is the configured
        fleet-wide concurrency limit (a limit stored with
        :meth:`Broker.set_queue_limit` overrides it), *local* the number of
        tasks this caller may still start from the queue; -1 = no limit. A
        queue stored with a limit is limited even when absent from *limits*.
        ``(fleet, local, interval, burst)`` adds a rate limit: a token bucket in
        Redis giving one task every *interval* microseconds (Redis TIME), at most
        *burst* at once; a queue out of tokens is skipped and reported held.
        """
        if count < 1:
            raise ValueError(f"dequeue count must be at least 1, got {count}")
        broker = self._broker
        out: list[DequeuedTask] = []
        empty: set[str] = set()
        held: set[str] = set()
        budget = -1 if max_bytes is None else max(0, max_bytes)
        for node, names in await self._groups(qnames, runs=strict):
            now = broker.clock()
            expiry = now + broker.lease_duration
            args = (
                int(expiry),
                count - len(out),
                budget,
                1 if first_free and not out else 0,
                _probe(node),
                int(now),
                _limit_spec(names, limits),
            )
            try:
                empties, taken, full, held_at = await self._call(_DEQUEUE, node, names, args)
            except REDIS_ERRORS as exc:
                if not out:
                    raise
                if self._errors.allow():
                    _log.warning(
                        "dequeue failed after tasks were taken; returning those",
                        taken=len(out),
                        error=error_text(exc),
                        suppressed_since_last=self._errors.take_suppressed(),
                    )
                break
            empty.update(names[i - 1] for i in empties)
            held.update(names[i - 1] for i in held_at)
            size = 0
            # Per task only what varies: the queue's keys are looked up once per queue
            # position, and a usable message (nearly every one) costs no coroutine call.
            at = -1
            qk = broker._q(names[0])
            for i in range(0, len(taken), 3):
                if taken[i] != at:
                    at = taken[i]
                    qk = broker._q(names[at - 1])
                raw = taken[i + 1]
                tid = raw.decode() if isinstance(raw, bytes) else raw
                data = taken[i + 2]
                if data is None:
                    _log.error("dropped pending id without task hash", task_id=tid, queue=qk.name)
                    continue
                size += len(data)
                found = usable_message(data, tid, qk.name)
                if isinstance(found, str):
                    await broker._archive_unusable(qk, tid, found, now, qk.active)
                else:
                    out.append(DequeuedTask(found, expiry))
            if len(out) >= count or full:
                break
            if budget >= 0:
                budget = max(0, budget - size)
        return FetchResult(out, empty, held)

    # -- forwarder, recoverer, janitor ---------------------------------------------------------

    async def forward(self, qnames: Sequence[str]) -> int:
        """Move due scheduled/retry tasks of every queue to pending (or their group)."""
        return (await self.forward_due(qnames))[0]

    async def forward_due(self, qnames: Sequence[str]) -> tuple[int, float | None]:
        """:meth:`forward`, and the earliest score left in the queues' scheduled and retry
        sets (unix seconds; None when they are empty), read in the same script call."""
        broker = self._broker
        total = 0
        earliest: float | None = None
        for node, names in await self._groups(qnames, runs=False):
            while True:
                now = broker.clock()
                args = (int(now), int(now * 1_000_000_000), FORWARD_BATCH, _probe(node))
                moved, more, first, *damaged = await self._call(_FORWARD, node, names, args)
                self._skipped("forward", damaged[0] if damaged else ())
                total += int(moved)
                if not more:
                    break
            score = as_text(first)
            if score and (earliest is None or float(score) < earliest):
                earliest = float(score)
        return total, earliest

    async def scan_leases(
        self, cutoff: datetime, qnames: Sequence[str]
    ) -> tuple[list[tuple[str, TaskMessage]], float | None]:
        """``(queue, message)`` of the active tasks whose lease expired at or before
        *cutoff*, and the earliest lease expiry after it (unix seconds; None when no other
        task of these queues is active).

        The queue is the one the task is stored in (its message may name another). A
        message that cannot be decoded is archived instead."""
        broker = self._broker
        cut = to_unix(cutoff)
        out: list[tuple[str, TaskMessage]] = []
        earliest: float | None = None
        for node, names in await self._groups(qnames, runs=False):
            res = await self._call(_LIST_LEASE_EXPIRED, node, names, (cut, _probe(node)))
            first = as_text(res[0])
            if first and (earliest is None or float(first) < earliest):
                earliest = float(first)
            damaged = [res[i + 1] for i in range(1, len(res), 3) if res[i] == 0]
            self._skipped("lease scan", damaged)
            for i in range(1, len(res), 3):
                if res[i] == 0:
                    continue
                qk = broker._q(names[res[i] - 1])
                msg = await broker._decode_or_archive(
                    qk, as_text(res[i + 1]), res[i + 2], broker.clock(), qk.active
                )
                if msg is not None:
                    out.append((qk.name, msg))
        return out, earliest

    async def delete_expired_completed(self, qnames: Sequence[str], batch_size: int = 100) -> int:
        """Delete completed tasks past their retention, *batch_size* per queue and call."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        broker = self._broker
        total = 0
        for node, names in await self._groups(qnames, runs=False):
            while True:
                args = (int(broker.clock()), batch_size, _probe(node))
                deleted, more, *damaged = await self._call(
                    _DELETE_EXPIRED_COMPLETED, node, names, args
                )
                self._skipped("completed task cleanup", damaged[0] if damaged else ())
                total += int(deleted)
                if not more:
                    break
        return total

    async def reclaim_stale_aggregation_sets(self, qnames: Sequence[str]) -> None:
        """Put members of aggregation sets past their deadline back into their group."""
        broker = self._broker
        for node, names in await self._groups(qnames, runs=False):
            args = (int(broker.clock()), _probe(node))
            reply = await self._call(_RECLAIM, node, names, args)
            if isinstance(reply, list):
                self._skipped("aggregation set reclaim", reply)
