"""Heartbeat writes: what servers and schedulers write about themselves.

A server's state and a scheduler's entries, each rewritten every heartbeat with a TTL,
and a scheduler's enqueue history (asynq's ``WriteServerState``,
``WriteSchedulerEntries`` and ``RecordSchedulerEnqueueEvent``). The Inspector reads
them back as its records (:mod:`asyncq._inspection.records`). Beside them, asyncq's
own scheduler leases: the claim on one cron tick and the lease on listing a shared
entry, each one script over its one key (so a cluster takes them too) that replaces
what no scheduler writes instead of waiting on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from asyncq import _keys as keys
from asyncq._broker._base import (
    LUA_PACKAGE,
    SCHEDULER_HISTORY_CAP,
    BrokerBase,
    record_ttl,
)
from asyncq._codec import encode_record
from asyncq._redis.scripts import load_script
from asyncq._time import to_unix
from asyncq.proto.asynq import SchedulerEnqueueEvent as SchedulerEnqueueEventProto
from asyncq.proto.asynq import SchedulerEntry as SchedulerEntryProto
from asyncq.proto.asynq import ServerInfo as ServerInfoProto
from asyncq.proto.asynq import WorkerInfo as WorkerInfoProto

__all__ = ["ClaimOutcome", "HeartbeatWrites"]

_WRITE_SERVER_STATE = load_script(LUA_PACKAGE, "write_server_state")
_WRITE_SERVER_TYPE_RATES = load_script(LUA_PACKAGE, "write_server_type_rates")
_WRITE_SCHEDULER_ENTRIES = load_script(LUA_PACKAGE, "write_scheduler_entries")
_RECORD_SCHEDULER_ENQUEUE_EVENT = load_script(LUA_PACKAGE, "record_scheduler_enqueue_event")
_SCHEDULER_CLAIM = load_script(LUA_PACKAGE, "scheduler_claim")
_SCHEDULER_LISTING = load_script(LUA_PACKAGE, "scheduler_listing")

ClaimOutcome = Literal["claimed", "done", "held", "replaced"]
"""What :meth:`HeartbeatWrites.claim_tick` found; see ``lua/scheduler_claim.lua``."""
_OUTCOMES: dict[str, ClaimOutcome] = {o: o for o in ("claimed", "done", "held", "replaced")}


def _shown(raw: Any) -> str:
    """A stored value as a warning names it: text, at most 80 characters."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)
    return text if len(text) <= 80 else text[:77] + "..."


class HeartbeatWrites(BrokerBase):
    """What servers and schedulers publish about themselves for the Inspector and the CLI."""

    async def write_server_state(
        self,
        info: ServerInfoProto,
        workers: Sequence[WorkerInfoProto],
        ttl: float,
        *,
        type_rates: Mapping[str, str] | None = None,
        queue_flow: Mapping[str, str] | None = None,
    ) -> None:
        """Heartbeat: the ServerInfo and WorkerInfo protobufs with *ttl* seconds to live.

        *type_rates* (``{task type: "600/min"}``) and *queue_flow* (see
        :func:`asyncq._keys.server_queue_flow_key`), when not empty, go to
        asyncq-only hashes beside them with the same TTL, for the Inspector.
        """
        secs = record_ttl(ttl)
        skey = keys.server_info_key(info.host, info.pid, info.server_id)
        wkey = keys.workers_key(info.host, info.pid, info.server_id)
        exp = int(self.clock() + secs)
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command("ZADD", keys.ALL_SERVERS, exp, skey)
        pipe.execute_command("ZADD", keys.ALL_WORKERS, exp, wkey)
        await pipe.execute()
        args: list[Any] = [secs, encode_record(info)]
        for w in workers:
            args += (w.task_id, encode_record(w))
        await self._run(_WRITE_SERVER_STATE, (skey, wkey), args, "", "")
        if type_rates:
            tkey = keys.server_type_rates_key(info.host, info.pid, info.server_id)
            targs: list[Any] = [secs]
            for task_type, rate in type_rates.items():
                targs += (task_type, rate)
            await self._run(_WRITE_SERVER_TYPE_RATES, (tkey,), targs, "", "")
        if queue_flow:
            # The same replace-whole-hash-with-TTL script as the type rates.
            fkey = keys.server_queue_flow_key(info.host, info.pid, info.server_id)
            fargs: list[Any] = [secs]
            for name, value in queue_flow.items():
                fargs += (name, value)
            await self._run(_WRITE_SERVER_TYPE_RATES, (fkey,), fargs, "", "")

    async def clear_server_state(self, host: str, pid: int, server_id: str) -> None:
        """Remove a server's info and workers records."""
        skey = keys.server_info_key(host, pid, server_id)
        wkey = keys.workers_key(host, pid, server_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command("ZREM", keys.ALL_SERVERS, skey)
        pipe.execute_command("ZREM", keys.ALL_WORKERS, wkey)
        # One DEL: the four keys share the server's hash tag (one slot).
        pipe.execute_command(
            "DEL",
            skey,
            wkey,
            keys.server_type_rates_key(host, pid, server_id),
            keys.server_queue_flow_key(host, pid, server_id),
        )
        await pipe.execute()

    async def write_scheduler_entries(
        self, scheduler_id: str, entries: Sequence[SchedulerEntryProto], ttl: float
    ) -> None:
        """Scheduler heartbeat: replace the scheduler's entry list, expiring after *ttl*."""
        secs = record_ttl(ttl)
        key = keys.scheduler_entries_key(scheduler_id)
        exp = int(self.clock() + secs)
        await self.redis.execute_command("ZADD", keys.ALL_SCHEDULERS, exp, key)
        args: list[Any] = [secs, *(encode_record(e) for e in entries)]
        await self._run(_WRITE_SCHEDULER_ENTRIES, (key,), args, "", "")

    async def clear_scheduler_entries(self, scheduler_id: str) -> None:
        """Remove a scheduler's entries record."""
        key = keys.scheduler_entries_key(scheduler_id)
        await self.redis.execute_command("ZREM", keys.ALL_SCHEDULERS, key)
        await self.redis.execute_command("DEL", key)

    async def record_scheduler_enqueue_event(
        self, entry_id: str, event: SchedulerEnqueueEventProto
    ) -> None:
        """Append to an entry's history, keeping the newest 1,000 events."""
        if event.enqueue_time is None:
            raise ValueError(f"scheduler enqueue event for task {event.task_id!r} has no time")
        await self._run(
            _RECORD_SCHEDULER_ENQUEUE_EVENT,
            (keys.scheduler_history_key(entry_id),),
            (to_unix(event.enqueue_time), encode_record(event), SCHEDULER_HISTORY_CAP),
            "",
            "",
        )

    async def clear_scheduler_history(self, entry_id: str) -> None:
        """Delete an entry's history."""
        await self.redis.execute_command("DEL", keys.scheduler_history_key(entry_id))

    async def claim_tick(
        self, claim_key: str, claimant: str, lease_ms: int
    ) -> tuple[ClaimOutcome, str, int]:
        """Claim one cron tick for *claimant* (``<scheduler id>/<entry id>``) for
        *lease_ms*: ``(outcome, what the key held, its PTTL in ms)``, the held value as
        text for a log line."""
        outcome, held, pttl = await self._run(
            _SCHEDULER_CLAIM, (claim_key,), (claimant, lease_ms), "", ""
        )
        found = _OUTCOMES.get(_shown(outcome))
        if found is None:
            raise ValueError(f"scheduler_claim.lua answered {_shown(outcome)!r}")
        return found, _shown(held), int(pttl)

    async def hold_listing(
        self, lister_key: str, scheduler_id: str, lease_ms: int
    ) -> tuple[bool, str | None]:
        """Take or renew the lease on listing a shared entry: ``(held, replaced)``, where
        *replaced* names what the key held when it was no scheduler's lease."""
        held, replaced, found = await self._run(
            _SCHEDULER_LISTING, (lister_key,), (scheduler_id, lease_ms, "take"), "", ""
        )
        return held == 1, (_shown(found) if replaced == 1 else None)

    async def release_listing(self, lister_key: str, scheduler_id: str) -> bool:
        """Hand the listing lease back if *scheduler_id* holds it."""
        released = await self._run(
            _SCHEDULER_LISTING, (lister_key,), (scheduler_id, 0, "release"), "", ""
        )
        return bool(released == 1)
