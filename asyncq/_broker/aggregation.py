"""Group transitions: groups, aggregation sets and their recovery (the broker's side of
group aggregation; the ``Server`` setting is :class:`asyncq.Aggregation`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from asyncq import _keys as keys
from asyncq._broker._base import (
    AGGREGATION_TIMEOUT,
    LUA_PACKAGE,
    BrokerBase,
    as_text,
    check_group,
)
from asyncq._duration import ttl_seconds
from asyncq._redis.scripts import load_script
from asyncq._time import to_unix
from asyncq.errors import (
    BrokerError,
)
from asyncq.proto.asynq import (
    TaskMessage,
)

__all__ = ["GroupTransitions"]

_AGGREGATION_CHECK = load_script(LUA_PACKAGE, "aggregation_check")
_READ_AGGREGATION_SET = load_script(LUA_PACKAGE, "read_aggregation_set")
_DELETE_AGGREGATION_SET = load_script(LUA_PACKAGE, "delete_aggregation_set")


class GroupTransitions(BrokerBase):
    """Group aggregation of asynq's aggregating tasks."""

    # -- aggregation (spec section 3.3) -----------------------------------------------------

    async def list_groups(self, qname: str) -> list[str]:
        """Names of the queue's groups with aggregating tasks (sorted)."""
        qk = self._q(qname)
        members = await self.redis.execute_command("SMEMBERS", qk.groups)
        return sorted(as_text(m) for m in members)

    async def aggregation_check(  # noqa: PLR0917 - the Broker interface's signature
        self,
        qname: str,
        group: str,
        t: datetime,
        grace_period: float | timedelta,
        max_delay: float | timedelta,
        max_size: int,
    ) -> str | None:
        """Stage an aggregation set when the group is ready; returns its set ID or None.

        Durations are whole seconds (or timedeltas); 0 disables *max_delay* and *max_size*.
        """
        qk = self._q(qname)
        check_group(group)
        if max_size < 0:
            raise ValueError(f"max_size must not be negative, got {max_size}")
        grace = ttl_seconds(grace_period, "grace_period")
        delay = ttl_seconds(max_delay, "max_delay")
        tick = to_unix(t)
        set_id = str(uuid.uuid4())
        gkey = qk.group_prefix + group
        res = await self._run(
            _AGGREGATION_CHECK,
            (gkey, f"{gkey}:{set_id}", qk.aggregation_sets, qk.groups),
            (max_size, delay, grace, int(self.clock()) + AGGREGATION_TIMEOUT, tick, group),
            qname,
            "",
        )
        return set_id if res == 1 else None

    async def read_aggregation_set(
        self, qname: str, group: str, set_id: str
    ) -> tuple[list[TaskMessage], datetime]:
        """The staged messages (by joining second, then task id) and the set's deadline.

        Raises BrokerError when the set is not staged (any more). A member whose
        message cannot be decoded is archived (and logged) instead of returned.
        """
        qk = self._q(qname)
        skey = keys.aggregation_set_key(qname, group, set_id)
        res = await self._run(
            _READ_AGGREGATION_SET, (skey, qk.aggregation_sets), (qk.task_prefix,), qname, ""
        )
        deadline = res.pop()
        if deadline is None:
            raise BrokerError(f"aggregation set {skey!r} is not staged in queue {qname!r}")
        msgs: list[TaskMessage] = []
        for i in range(0, len(res), 2):
            msg = await self._decode_or_archive(qk, as_text(res[i]), res[i + 1], self.clock(), skey)
            if msg is not None:
                msgs.append(msg)
        return msgs, datetime.fromtimestamp(int(float(deadline)), UTC)

    async def delete_aggregation_set(self, qname: str, group: str, set_id: str) -> None:
        """Delete a staged set and its members' task hashes (after the aggregate is enqueued)."""
        qk = self._q(qname)
        await self._run(
            _DELETE_AGGREGATION_SET,
            (keys.aggregation_set_key(qname, group, set_id), qk.aggregation_sets),
            (qk.task_prefix,),
            qname,
            "",
        )


# Position of the task id in each enqueue-like script's ARGV (0-based), for batch results.
