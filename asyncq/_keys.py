"""The Redis key schema shared with Go asynq v0.26 (its ``internal/base``).

Every per-queue key starts with ``asynq:{<qname>}:``; the braces are a Redis
Cluster hash tag, so all of a queue's keys (task hashes, unique locks, groups)
live in one slot. Global keys are not co-located with any queue. This module
is the only place that spells key names.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

__all__ = [
    "ALL_QUEUES",
    "ALL_SCHEDULERS",
    "ALL_SERVERS",
    "ALL_WORKERS",
    "CANCEL_CHANNEL",
    "EVENTS_KEY",
    "STOP_MARK",
    "active_key",
    "aggregation_set_key",
    "all_aggregation_sets",
    "all_groups",
    "archived_key",
    "awaiting_key",
    "completed_key",
    "expected_type",
    "failed_key",
    "failed_total_key",
    "group_key",
    "group_key_prefix",
    "lease_key",
    "metrics_history_key",
    "paused_key",
    "pending_key",
    "processed_key",
    "processed_total_key",
    "progress_channel",
    "progress_key",
    "queue_key_prefix",
    "refuse_braces",
    "retry_key",
    "run_key",
    "scheduled_key",
    "scheduler_claim_key",
    "scheduler_entries_key",
    "scheduler_history_key",
    "scheduler_lister_key",
    "server_info_key",
    "server_queue_flow_key",
    "server_type_rates_key",
    "signal_key",
    "task_key",
    "task_key_prefix",
    "unique_key",
    "validate_queue_name",
    "wakeup_channel",
    "workers_key",
]

ALL_SERVERS = "asynq:servers"
"""ZSET: server-info key name -> expiry (unix s)."""
ALL_WORKERS = "asynq:workers"
"""ZSET: workers key name -> expiry (unix s)."""
ALL_SCHEDULERS = "asynq:schedulers"
"""ZSET: scheduler entries key name -> expiry (unix s)."""
ALL_QUEUES = "asynq:queues"
"""SET of every queue name ever enqueued to."""
CANCEL_CHANNEL = "asynq:cancel"
STOP_MARK = "{asyncq:stop}"
"""asyncq: a message on :data:`CANCEL_CHANNEL` that is this mark and a task ID cancels the
task for good (archived, not retried). Task IDs hold no braces, so no ID reads as one;
Go asynq servers match no task with it and ignore it."""
"""Pub/Sub channel; message payload is a task ID to cancel."""


def validate_queue_name(qname: str) -> None:
    """Raise ValueError when *qname* is blank (asynq's rule) or holds ``{`` or ``}``."""
    if not qname or not qname.strip():
        raise ValueError("queue name must contain one or more characters")
    refuse_braces("queue name", qname)


def refuse_braces(what: str, name: str) -> None:
    """Raise ValueError when *name* holds ``{`` or ``}``.

    Every key of a queue is ``asynq:{<queue>}:...``: a brace in a queue name, a
    group or a task ID can make two different things share one key (task ID
    ``foo}:pending`` in queue ``default`` against the pending list of queue
    ``default}:t:foo``) or move a key out of its queue's cluster slot.
    """
    if "{" in name or "}" in name:
        raise ValueError(
            f"{what} {name!r} holds '{{' or '}}', which asynq's key schema uses to delimit "
            "the queue name; choose a name without braces"
        )


def queue_key_prefix(qname: str) -> str:
    """``asynq:{<qname>}:``, the prefix of every per-queue key."""
    return f"asynq:{{{qname}}}:"


def task_key_prefix(qname: str) -> str:
    """``asynq:{<qname>}:t:``; scripts append a task ID to it."""
    return f"asynq:{{{qname}}}:t:"


def task_key(qname: str, task_id: str) -> str:
    """HASH holding one task: fields msg, state, pending_since, unique_key, group, result."""
    return f"asynq:{{{qname}}}:t:{task_id}"


def pending_key(qname: str) -> str:
    """LIST of ready task IDs: new work is LPUSHed, workers take from the tail."""
    return f"asynq:{{{qname}}}:pending"


def active_key(qname: str) -> str:
    """LIST of task IDs being processed."""
    return f"asynq:{{{qname}}}:active"


def scheduled_key(qname: str) -> str:
    """ZSET of task IDs scored by process-at time (unix s)."""
    return f"asynq:{{{qname}}}:scheduled"


def retry_key(qname: str) -> str:
    """ZSET of task IDs scored by retry-at time (unix s)."""
    return f"asynq:{{{qname}}}:retry"


def archived_key(qname: str) -> str:
    """ZSET of task IDs scored by archive time (unix s)."""
    return f"asynq:{{{qname}}}:archived"


def lease_key(qname: str) -> str:
    """ZSET of active task IDs scored by lease expiry (unix s)."""
    return f"asynq:{{{qname}}}:lease"


def completed_key(qname: str) -> str:
    """ZSET of completed task IDs scored by their expiry (completed_at + retention)."""
    return f"asynq:{{{qname}}}:completed"


def paused_key(qname: str) -> str:
    """STRING that exists exactly while the queue is paused."""
    return f"asynq:{{{qname}}}:paused"


def limit_key(qname: str) -> str:
    """asyncq-only STRING: the fleet-wide concurrency limit of a queue, set at runtime.

    Under the queue's hash tag (same Cluster slot as its lists); Go asynq, the
    asynq CLI and asynqmon never read a key of this name, so they ignore it.
    """
    return f"asynq:{{{qname}}}:asyncq:limit"


def ordered_key(qname: str) -> str:
    """asyncq-only STRING ``"1"``: the queue is ordered (one task at a time, head-of-line).

    Same hash tag as the queue's keys; Go asynq never reads it.
    """
    return f"asynq:{{{qname}}}:asyncq:ordered"


def rate_key(qname: str) -> str:
    """asyncq-only HASH: a queue's rate-limit bucket (tat, interval, burst), kept by workers.

    Same hash tag as the queue's keys; Go asynq never reads it.
    """
    return f"asynq:{{{qname}}}:asyncq:rate"


def waiters_key(qname: str) -> str:
    """asyncq-only LIST of the idle workers waiting for this queue's next task (direct delivery).

    Each member is ``<lease seconds>:<delivery channel>`` of one server (see
    :func:`delivery_channel`); an enqueue rotates through them. Same hash tag as
    the queue's keys; Go asynq never reads it.
    """
    return f"asynq:{{{qname}}}:asyncq:waiters"


def delivery_channel(server_id: str) -> str:
    """asyncq-only name of one server's direct delivery: a Pub/Sub channel and a STRING key.

    The channel carries the tasks an enqueue delivers to the server directly; the
    key holds how many it may still be delivered (its credit, with a TTL), so a
    server that stopped waiting, or died, is delivered nothing more.
    """
    return f"asyncq:delivery:{server_id}"


def type_rate_key(task_type: str) -> str:
    """asyncq-only HASH: a task type's rate-limit bucket (tat, interval, burst), fleet-wide.

    Also ``limited``: tokens refused (tasks put back to the retry set) since the
    bucket was created; the bucket expires an hour after it was last full.

    Not under any queue's hash tag (a type may go to many queues): its own slot,
    read and written by one script call per task of a rate-limited type. Go asynq
    never reads it.
    """
    return f"asyncq:typerate:{{{task_type}}}"


def processed_total_key(qname: str) -> str:
    """All-time processed counter (successes and failures)."""
    return f"asynq:{{{qname}}}:processed"


def failed_total_key(qname: str) -> str:
    """All-time failed counter."""
    return f"asynq:{{{qname}}}:failed"


def _date(when: datetime) -> str:
    # Daily counters are keyed by the UTC calendar date, whatever the local zone.
    if when.tzinfo is None:
        raise ValueError("stats keys need an aware datetime")
    return when.astimezone(UTC).strftime("%Y-%m-%d")


def processed_key(qname: str, when: datetime) -> str:
    """Per-UTC-day processed counter: ``asynq:{q}:processed:YYYY-MM-DD``."""
    return f"asynq:{{{qname}}}:processed:{_date(when)}"


def failed_key(qname: str, when: datetime) -> str:
    """Per-UTC-day failed counter: ``asynq:{q}:failed:YYYY-MM-DD``."""
    return f"asynq:{{{qname}}}:failed:{_date(when)}"


def completion_channel(qname: str) -> str:
    """asyncq-only Pub/Sub channel on which workers publish the IDs of finished tasks.

    It is a channel, not a key: Go asynq never subscribes to it. A message is
    a task ID whose task was just marked completed (with a retention) or archived.
    """
    return f"asyncq:done:{{{qname}}}"


def progress_key(queue: str, task_id: str) -> str:
    """asyncq-only hash holding a task's last reported progress."""
    return f"asyncq:{{{queue}}}:progress:{task_id}"


def progress_channel(queue: str) -> str:
    """asyncq-only Pub/Sub channel carrying the progress updates of a queue's tasks."""
    return f"asyncq:progress:{{{queue}}}"


EVENTS_KEY = "asyncq:events"
"""The stream holding every queue's task events (:mod:`asyncq.events`)."""


def metrics_history_key(qname: str, minute: int) -> str:
    """asyncq's metrics history of a queue for one minute (HASH, see :mod:`asyncq.history`):
    ``asynq:{q}:asyncq:metrics:<unix minute>``."""
    return f"asynq:{{{qname}}}:asyncq:metrics:{minute}"


def unique_key(qname: str, task_type: str, payload: bytes | None) -> str:
    """Uniqueness lock key for (queue, type, payload).

    A ``None`` payload (Go's nil slice) gives an empty checksum, while an empty
    ``b""`` payload hashes to md5("") -- the two differ, exactly as in asynq.
    """
    checksum = "" if payload is None else hashlib.md5(payload).hexdigest()
    return f"asynq:{{{qname}}}:unique:{task_type}:{checksum}"


def all_groups(qname: str) -> str:
    """SET of group names with aggregating tasks in the queue."""
    return f"asynq:{{{qname}}}:groups"


def group_key_prefix(qname: str) -> str:
    """``asynq:{<qname>}:g:``; scripts append a group name to it."""
    return f"asynq:{{{qname}}}:g:"


def group_key(qname: str, group: str) -> str:
    """ZSET of aggregating task IDs in *group*, scored by the time added (unix s)."""
    return f"asynq:{{{qname}}}:g:{group}"


def aggregation_set_key(qname: str, group: str, set_id: str) -> str:
    """ZSET of tasks staged for one aggregation run."""
    return f"asynq:{{{qname}}}:g:{group}:{set_id}"


def all_aggregation_sets(qname: str) -> str:
    """ZSET of aggregation set keys scored by their deadline (unix s)."""
    return f"asynq:{{{qname}}}:aggregation_sets"


def server_info_key(host: str, pid: int, server_id: str) -> str:
    """STRING holding a ServerInfo protobuf (TTL 2 x heartbeat)."""
    return f"asynq:servers:{{{host}:{pid}:{server_id}}}"


def workers_key(host: str, pid: int, server_id: str) -> str:
    """HASH task ID -> WorkerInfo protobuf for one server."""
    return f"asynq:workers:{{{host}:{pid}:{server_id}}}"


def server_type_rates_key(host: str, pid: int, server_id: str) -> str:
    """asyncq-only HASH task type -> rate (``"600/min"``): a live server's ``type_rate_limits``.

    Written with the server's heartbeat and the same TTL, in the server's slot
    (same hash tag as its asynq records), so the Inspector can list every type
    rate the fleet configures. Go asynq never reads it.
    """
    return f"asyncq:server_type_rates:{{{host}:{pid}:{server_id}}}"


def server_queue_flow_key(host: str, pid: int, server_id: str) -> str:
    """asyncq-only HASH of a live server's queue flow control, for the Inspector.

    Fields ``limit:<queue>`` (``queue_concurrency``), ``local:<queue>``
    (``local_queue_concurrency``), ``rate:<queue>`` (``rate_limits``, the rate
    text) and ``ordered:<queue>`` (``ordered_queues``, value ``1``), where
    ``<queue>`` is a name or a pattern as configured. Written with the server's
    heartbeat and the same TTL, in the server's slot. Go asynq never reads it.
    """
    return f"asyncq:server_queue_flow:{{{host}:{pid}:{server_id}}}"


def scheduler_entries_key(scheduler_id: str) -> str:
    """LIST of SchedulerEntry protobufs written by one scheduler's heartbeat."""
    return f"asynq:schedulers:{{{scheduler_id}}}"


def scheduler_history_key(entry_id: str) -> str:
    """ZSET of SchedulerEnqueueEvent protobufs for one entry, scored by enqueue time."""
    return f"asynq:scheduler_history:{entry_id}"


def wakeup_channel(qname: str) -> str:
    """asyncq-only Pub/Sub channel that tells idle asyncq workers a queue has work.

    It is a channel, not a key: Go asynq never subscribes to it, so publishing
    on it changes nothing for Go servers, the asynq CLI or asynqmon.
    """
    return f"asyncq:wakeup:{{{qname}}}"


def run_key(qname: str, run_id: str) -> str:
    """``asynq:{<qname>}:asyncq:run:<run id>``: a durable run's record (asyncq-only HASH).

    Fields: ``s:<i>`` what the run's entry *i* was (a step's type and argument digest, a
    sleep, a wait...), ``r:<i>`` its result (JSON; ``""`` for a wait that timed out),
    ``e:<i>`` a failed step's error, ``d:<i>`` a sleep's or wait's deadline (unix s),
    ``state`` (running, waiting, succeeded, failed; cancelled by the Inspector),
    ``until`` (unix s) while it waits, ``wait``/``missing``/``w:<i>`` the steps it
    waits for. Under the run task's queue
    hash tag, so a run's keys share one cluster slot.
    """
    return f"asynq:{{{qname}}}:asyncq:run:{run_id}"


def signal_key(qname: str, name: str, key: str) -> str:
    """``asynq:{<qname>}:asyncq:signal:<name>:<key>``: a durable signal sent before any
    run waited for it (asyncq-only STRING holding its JSON payload, with an expiry)."""
    return f"asynq:{{{qname}}}:asyncq:signal:{name}:{key}"


def awaiting_key(qname: str, name: str, key: str) -> str:
    """``asynq:{<qname>}:asyncq:awaiting:<name>:<key>``: the runs waiting for a durable
    signal (asyncq-only SET of ``"<run id> <step index>"``)."""
    return f"asynq:{{{qname}}}:asyncq:awaiting:{name}:{key}"


def scheduler_lister_key(identity: str) -> str:
    """``asyncq:scheduler_lister:{<identity>}``: which of the schedulers sharing an entry
    lists it in its heartbeat record (``Scheduler(shared=True)``).

    asyncq-only; a STRING holding the scheduler ID, with a TTL of two heartbeats.
    """
    return f"asyncq:scheduler_lister:{{{identity}}}"


def scheduler_claim_key(identity: str, tick_unix: int) -> str:
    """``asyncq:scheduler_claims:{<identity>}:<tick unix s>``: who enqueues one cron tick.

    asyncq-only (asynq never reads it); a STRING holding the claimant's scheduler
    ID and entry ID, then ``done:<scheduler id>:<task id>``; always with a TTL.
    """
    return f"asyncq:scheduler_claims:{{{identity}}}:{tick_unix}"


_QUEUE_KEY_TYPES = {
    "pending": "list", "active": "list",
    "scheduled": "zset", "retry": "zset", "archived": "zset", "completed": "zset",
    "lease": "zset", "aggregation_sets": "zset", "g": "zset", "groups": "set",
    "t": "hash", "paused": "string", "processed": "string", "failed": "string",
    "unique": "string",
}  # fmt: skip
_QUEUE_ASYNCQ_KEY_TYPES = {"limit": "string", "ordered": "string", "rate": "hash"}
_QUEUE_ASYNCQ_PREFIX_TYPES = (("run:", "hash"), ("signal:", "string"), ("awaiting:", "set"))
_RECORD_KEY_TYPES = {
    ALL_QUEUES: "set", ALL_SERVERS: "zset", ALL_WORKERS: "zset", ALL_SCHEDULERS: "zset",
}  # fmt: skip
_RECORD_PREFIX_TYPES = (
    ("asynq:servers:", "string"),
    ("asynq:workers:", "hash"),
    ("asynq:schedulers:", "list"),
    ("asynq:scheduler_history:", "zset"),
)


def expected_type(key: str) -> str | None:
    """The Redis type (``TYPE``'s answer) asynq stores at *key*; None for a key it does
    not know. Used to name the damaged key when Redis answers WRONGTYPE."""
    known = _RECORD_KEY_TYPES.get(key)
    if known is not None:
        return known
    if key.startswith("asynq:{"):
        _, sep, rest = key.partition("}:")
        if not sep:
            return None
        part, _, tail = rest.partition(":")
        if part == "asyncq":
            if tail.startswith("metrics:"):
                return "hash"
            for prefix, kind in _QUEUE_ASYNCQ_PREFIX_TYPES:
                if tail.startswith(prefix):
                    return kind
            return _QUEUE_ASYNCQ_KEY_TYPES.get(tail)
        if part in ("t", "g", "unique") and not tail:
            return None
        return _QUEUE_KEY_TYPES.get(part)
    for prefix, kind in _RECORD_PREFIX_TYPES:
        if key.startswith(prefix):
            return kind
    return None
