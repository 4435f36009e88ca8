"""A server's settings, validated, and its in-process counters, shared by every role.

The user gives the settings as ``Server`` keywords, :class:`ServerOptions`: the common
ones by name, the rarely changed ones grouped in :class:`Intervals`, :class:`Limits` and
:class:`Aggregation` (:mod:`asyncq._worker.groups`, which also translates their
deprecated flat keywords). :func:`build_config` checks every value, naming the option of
a bad one, and returns the :class:`ServerConfig` the roles read (durations in seconds).
"""

from __future__ import annotations

import os
import types
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, TypeAlias

from typing_extensions import Unpack

from asyncq import _keys as keys
from asyncq._broker import LEASE_DURATION
from asyncq._broker.replication import replica_wait_seconds
from asyncq._duration import positive_seconds
from asyncq._worker.groups import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    GROUP_KEYWORDS,
    GROUPED_OPTION_NAMES,
    Aggregation,
    GroupAggregator,
    GroupedOptions,
    Intervals,
    Limits,
    Regrouped,
    flat_name_warning,
    merge_groups,
    overlay,
    regroup,
)
from asyncq._worker.limits import (
    Rate,
    validate_limits,
    validate_ordered,
    validate_rates,
    validate_type_rates,
)
from asyncq._worker.queueset import is_pattern, validate_pattern
from asyncq.events import event_queues
from asyncq.history import DEFAULT_RETENTION
from asyncq.task import Task

__all__ = [
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_METRICS_HISTORY",
    "DEFAULT_QUEUES",
    "GROUPED_OPTION_NAMES",
    "GROUP_KEYWORDS",
    "SERVER_OPTION_NAMES",
    "Aggregation",
    "ErrorHandler",
    "GroupAggregator",
    "GroupedOptions",
    "HealthCheck",
    "Intervals",
    "IsFailure",
    "Limits",
    "Regrouped",
    "RetryDelay",
    "ServerConfig",
    "ServerOptions",
    "ServerStats",
    "build_config",
    "flat_name_warning",
    "merge_groups",
    "overlay",
    "regroup",
]

DEFAULT_QUEUES: Mapping[str, int] = types.MappingProxyType({"default": 1})
"""Queues served when none are given (asynq's default)."""
DEFAULT_METRICS_HISTORY = True
"""Whether a server keeps the metrics history unless told (``metrics_history``): on, as
it costs about one dict lookup and a few list increments per task (docs/operations.md)."""

RetryDelay: TypeAlias = Callable[[int, BaseException, Task], timedelta]
"""``retry_delay(n, exc, task) -> timedelta``; *n* = retries so far (0 on the first failure)."""
IsFailure: TypeAlias = Callable[[BaseException], bool]
"""``is_failure(exc) -> bool``; False: retried without counting a retry or a failure."""
ErrorHandler: TypeAlias = Callable[[Task, BaseException], "Awaitable[None] | None"]
"""``error_handler(task, exc)``, sync or async; called on every failure before the retry."""
HealthCheck: TypeAlias = Callable[["BaseException | None"], "Awaitable[None] | None"]
"""``health_check(exc_or_none)``, sync or async; called every ``health_check_interval``."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A server's validated settings; durations in seconds."""

    concurrency: int
    queues: Mapping[str, int]
    strict_priority: bool
    retry_delay: RetryDelay | None
    """None: asynq's delay (:func:`asyncq._worker.policy.default_retry_delay`)."""
    is_failure: IsFailure | None
    """None: every error is a failure."""
    error_handler: ErrorHandler | None
    shutdown_timeout: float
    health_check: HealthCheck | None
    health_check_interval: float
    task_check_interval: float
    delayed_task_check_interval: float
    janitor_interval: float
    janitor_batch_size: int
    heartbeat_interval: float
    lease_duration: float
    recoverer_interval: float
    recoverer_cutoff: float
    group_aggregator: GroupAggregator | None
    group_grace_period: float
    group_max_delay: float
    group_max_size: int
    group_check_interval: float
    burst: bool
    sync_concurrency: int
    max_inflight_bytes: int
    queue_concurrency: Mapping[str, int] = field(default_factory=dict)
    """Fleet-wide limit per queue (live leases); see :mod:`asyncq._worker.limits`."""
    local_queue_concurrency: Mapping[str, int] = field(default_factory=dict)
    """Limit per queue for this server alone."""
    ordered_queues: tuple[str, ...] = ()
    """Queues this server marks ordered in Redis when it starts."""
    rate_limits: Mapping[str, Rate] = field(default_factory=dict)
    """Fleet-wide token bucket per queue (Redis TIME); see :mod:`asyncq._worker.limits`."""
    type_rate_limits: Mapping[str, Rate] = field(default_factory=dict)
    """Fleet-wide token bucket per task type, taken after the dequeue; see
    :mod:`asyncq._broker.typerate`."""
    queue_refresh_interval: float = 1.0
    """How often a server with queue patterns re-reads ``asynq:queues``."""
    metrics_history: timedelta | None = None
    """How long the metrics history keeps each minute; None: the server keeps none."""
    events: bool | tuple[str, ...] = False
    """The queues whose task events the server writes: all (True), none, or these names
    and patterns."""
    min_replicas: int = 0
    """Replica acknowledgements a finished attempt's outcome waits for (0: none)."""
    replica_timeout: float = 1.0
    """How long it waits for them."""
    syncer_interval: float = 5.0
    """How often the syncer retries the writes Redis refused (asynq hard-codes 5 s). Not
    a ``Server`` option: a test that needs it shorter sets ``server.syncer.interval``."""


@dataclass(slots=True)
class ServerStats:
    """Counters of what this server did since it started (in-process only)."""

    succeeded: int = 0
    """Handlers that returned (or raised RevokeTask)."""
    failed: int = 0
    """Handlers that raised, timed out, were cancelled or lost their lease."""
    requeued: int = 0
    """Tasks put back to pending at shutdown."""
    type_rate_limited: int = 0
    """Tasks put back to the retry set, unrun, because their type's rate had no token."""
    recovered: int = 0
    """Tasks with an expired lease retried or archived by this server's recoverer."""
    forwarded: int = 0
    """Scheduled/retry tasks moved to pending by this server's forwarder."""
    wakeups: int = 0
    """Idle waits ended by a wake-up (Pub/Sub message or forwarder) rather than a timeout."""
    wakeup_messages: int = 0
    """Wake-up messages received on the queues' channels."""
    delivered: int = 0
    """Tasks an enqueue delivered to this server directly (no fetch)."""
    continued: int = 0
    """Tasks started in the slot of the task before them, without a fetch: a durable run's
    step leased to us by the run's suspension, or the run its step's success woke."""
    inline: int = 0
    """Durable steps run inline: in the slot of their run's attempt, which awaited them
    (see :meth:`asyncq._worker.attempt.Attempts.run_inline`)."""
    invalidations: int = 0
    """Key-tracking invalidations received (a served queue's pending list or paused flag
    written by anyone, Go asynq included; see :mod:`asyncq._worker.wakeup`)."""
    idle_timeouts: int = 0
    """Idle waits that ran the full ``task_check_interval``."""
    empty_fetches: int = 0
    """Fetches that found every queue empty (or paused)."""
    fetch_errors: int = 0
    """Fetches that failed (Redis unreachable...)."""
    janitor_deleted: int = 0
    """Completed tasks deleted after their retention."""
    aggregated: int = 0
    """Aggregated tasks enqueued."""
    aggregation_errors: int = 0
    """Aggregations that failed (their tasks return to the group later)."""
    loop_stalls: int = 0
    """Times a handler (or other code) blocked the event loop longer than the watchdog's
    threshold (see the WARNING "event loop blocked")."""
    loop_stalled_seconds: float = 0.0
    """Total seconds the event loop was blocked in those stalls."""
    role_restarts: Counter[str] = field(default_factory=Counter)
    """Crashes per role (each followed by a restart)."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value.__class__.__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, got {value.__class__.__name__}")


class ServerOptions(GroupedOptions, total=False):
    """The :class:`~asyncq.Server`'s settings, all keyword, all optional:
    ``Server(redis, concurrency=20, queues={"critical": 6, "default": 3})``.

    Durations are ``timedelta``s; defaults are asynq's. The rarely changed settings
    come in groups: :class:`~asyncq.Intervals`, :class:`~asyncq.Limits` and
    :class:`~asyncq.Aggregation`. A bad value raises TypeError or ValueError naming
    the option; an unknown name raises TypeError.
    """

    concurrency: int | None
    """Handlers running at once (default: the number of CPUs)."""
    queues: Mapping[str, int] | None
    """Queue name -> priority (default ``{"default": 1}``). Names may be fnmatch-style
    patterns (``{"tenant:*": 1}``): the server serves every queue of ``asynq:queues``
    that matches, re-read every ``intervals.queue_refresh`` (1 s), so queues created
    later are served and removed ones are dropped. An explicit name wins over a
    pattern. With ``strict_priority`` each match has the pattern's priority; in weighted
    order the pattern's weight is split among its matches. The :class:`Limits` accept
    patterns too (each match gets its own limit; see docs/flow-control.md)."""
    strict_priority: bool
    """Always empty higher-priority queues first (default False: weighted order)."""
    retry_delay: RetryDelay | None
    """``retry_delay(n, exc, task)``: the delay before retry *n* (default: asynq's
    n**4 + 15 + rand(30)*(n+1) s)."""
    is_failure: IsFailure | None
    """``is_failure(exc)``: False retries without counting the attempt."""
    error_handler: ErrorHandler | None
    """``error_handler(task, exc)``, sync or async: called on every failure."""
    shutdown_timeout: timedelta
    """How long shutdown waits for running handlers before requeueing them (8 s)."""
    health_check: HealthCheck | None
    """``health_check(exc | None)``, sync or async: called every
    ``intervals.health_check`` (15 s) with the outcome of a Redis ping."""
    lease_duration: timedelta
    """A running task's lease (30 s; asynq hard-codes it), extended by every heartbeat.
    A killed worker's tasks run again on another worker about ``lease_duration`` +
    ``intervals.recoverer_cutoff`` after the kill."""
    burst: bool
    """Shut down once the queues are empty and nothing runs."""
    intervals: Intervals | None
    """How often the background roles act (:class:`Intervals`)."""
    limits: Limits | None
    """Bounds on what runs beyond ``concurrency`` (:class:`Limits`)."""
    aggregation: Aggregation | None
    """Group aggregation, on when its ``aggregator`` is set (:class:`Aggregation`)."""
    metrics_history: bool | timedelta
    """Keep the per-minute history of each task type (processed, failed, retried,
    run-time histogram) in Redis: True keeps it 24 h (the default), a timedelta that
    long, False keeps none. Counted in memory where each outcome is decided and written
    every 5 s in aggregate (one script call per queue); see :mod:`asyncq.history`."""
    min_replicas: int
    """A finished attempt's outcome (done, completed, retry, archive) counts only once
    this many replicas acknowledged it (Redis ``WAIT``); otherwise the outcome is logged
    as unconfirmed and the task may run again after a failover (default 0: off)."""
    replica_timeout: timedelta
    """How long an outcome waits for ``min_replicas`` acknowledgements (1 s)."""
    events: bool | Sequence[str]
    """Write task events (started, progress, succeeded, failed, ...) to the event stream
    (:mod:`asyncq.events`) for every queue (True) or the listed queue names and
    patterns; off by default (docs/events.md)."""


SERVER_OPTION_NAMES: Final = frozenset(ServerOptions.__annotations__)
"""Every name :class:`ServerOptions` takes, the deprecated flat ones included."""


def _queues(queues: object) -> Mapping[str, int]:
    queues = DEFAULT_QUEUES if queues is None else queues
    if not isinstance(queues, Mapping):
        raise TypeError(f"queues must be a mapping of name to priority, got {queues!r}")
    if not queues:
        raise ValueError("queues cannot be empty (omit it to serve {'default': 1})")
    for qname, prio in queues.items():
        if not isinstance(qname, str) or not qname.strip():
            raise ValueError(f"queue names must be non-blank strings, got {qname!r}")
        keys.refuse_braces("queue name", qname)
        if is_pattern(qname):
            validate_pattern("queues", qname)
        if isinstance(prio, bool) or not isinstance(prio, int) or prio < 1:
            raise ValueError(f"queue {qname!r} needs an integer priority >= 1, got {prio!r}")
    return types.MappingProxyType(dict(queues))


def build_config(**options: Unpack[ServerOptions]) -> ServerConfig:
    """The ``Server`` keywords (:class:`ServerOptions`), checked, as the config its roles read.

    A bad value raises TypeError or ValueError naming the option as the user wrote it;
    an unknown name raises TypeError; each deprecated flat name warns.
    """
    given: dict[str, Any] = dict(options)
    for key in given:
        if key not in SERVER_OPTION_NAMES:
            raise TypeError(f"Server() got an unexpected keyword argument {key!r}")
    regrouped = regroup(given)
    for flat in regrouped.flat:
        # stacklevel 3: the Server(...) call (build_config < Server.__init__ < caller)
        warnings.warn(flat_name_warning("Server", flat), DeprecationWarning, stacklevel=3)
    name = regrouped.names
    groups = merge_groups({}, regrouped)
    every: Intervals = groups.get("intervals") or Intervals()
    bound: Limits = groups.get("limits") or Limits()
    agg: Aggregation = groups.get("aggregation") or Aggregation()
    concurrency = given.get("concurrency")
    concurrency = (os.cpu_count() or 1) if concurrency is None else concurrency
    concurrency = _positive_int("concurrency", concurrency)
    for label in ("retry_delay", "is_failure", "error_handler", "health_check"):
        _callable(label, given.get(label))
    _callable(name["group_aggregator"], agg.aggregator)
    lease_duration = given.get("lease_duration", timedelta(seconds=LEASE_DURATION))
    second = timedelta(seconds=1)
    grace = positive_seconds(agg.grace_period, name["group_grace_period"], minimum=second)
    max_delay = 0.0
    if agg.max_delay is not None and agg.max_delay != timedelta(0):
        max_delay = positive_seconds(agg.max_delay, name["group_max_delay"], minimum=second)
    max_size = 0
    if agg.max_size is not None and agg.max_size != 0:
        max_size = _positive_int(name["group_max_size"], agg.max_size)
    check_interval = min(7.0, grace)
    if agg.check_interval is not None:
        check_interval = positive_seconds(agg.check_interval, name["group_check_interval"])
    heartbeat = positive_seconds(every.heartbeat, name["heartbeat_interval"])
    lease = positive_seconds(lease_duration, "lease_duration", minimum=timedelta(seconds=2))
    if lease <= heartbeat:
        raise ValueError(
            f"lease_duration ({lease_duration}) must be longer than "
            f"{name['heartbeat_interval']} ({every.heartbeat}): the heartbeat extends the leases"
        )
    cutoff = every.recoverer_cutoff
    if not isinstance(cutoff, timedelta):
        raise TypeError(
            f"{name['recoverer_cutoff']} must be a datetime.timedelta, "
            f"got {cutoff.__class__.__name__}"
        )
    if cutoff < timedelta(0):
        raise ValueError(f"{name['recoverer_cutoff']} cannot be negative, got {cutoff}")
    sync_concurrency = concurrency if bound.sync_concurrency is None else bound.sync_concurrency
    return ServerConfig(
        concurrency=concurrency,
        queues=_queues(given.get("queues")),
        strict_priority=bool(given.get("strict_priority", False)),
        retry_delay=given.get("retry_delay"),
        is_failure=given.get("is_failure"),
        error_handler=given.get("error_handler"),
        shutdown_timeout=positive_seconds(
            given.get("shutdown_timeout", timedelta(seconds=8)), "shutdown_timeout"
        ),
        health_check=given.get("health_check"),
        health_check_interval=positive_seconds(every.health_check, name["health_check_interval"]),
        task_check_interval=positive_seconds(every.task_check, name["task_check_interval"]),
        delayed_task_check_interval=positive_seconds(
            every.delayed_task_check, name["delayed_task_check_interval"]
        ),
        janitor_interval=positive_seconds(every.janitor, name["janitor_interval"]),
        janitor_batch_size=_positive_int(name["janitor_batch_size"], bound.janitor_batch_size),
        heartbeat_interval=heartbeat,
        lease_duration=lease,
        recoverer_interval=positive_seconds(every.recoverer, name["recoverer_interval"]),
        recoverer_cutoff=cutoff.total_seconds(),
        group_aggregator=agg.aggregator,
        group_grace_period=grace,
        group_max_delay=max_delay,
        group_max_size=max_size,
        group_check_interval=check_interval,
        burst=bool(given.get("burst", False)),
        sync_concurrency=_positive_int(name["sync_concurrency"], sync_concurrency),
        max_inflight_bytes=_positive_int(name["max_inflight_bytes"], bound.max_inflight_bytes),
        queue_concurrency=validate_limits(name["queue_concurrency"], bound.queue_concurrency),
        local_queue_concurrency=validate_limits(
            name["local_queue_concurrency"], bound.local_queue_concurrency
        ),
        rate_limits=validate_rates(name["rate_limits"], bound.rate_limits),
        ordered_queues=validate_ordered(bound.ordered_queues),
        type_rate_limits=validate_type_rates(name["type_rate_limits"], bound.type_rate_limits),
        queue_refresh_interval=positive_seconds(
            every.queue_refresh, name["queue_refresh_interval"]
        ),
        metrics_history=_history_retention(given.get("metrics_history", DEFAULT_METRICS_HISTORY)),
        events=event_queues("events", given.get("events", False)),
        min_replicas=given.get("min_replicas", 0),
        replica_timeout=replica_wait_seconds(
            given.get("min_replicas", 0), given.get("replica_timeout", timedelta(seconds=1))
        ),
    )


def _history_retention(value: object) -> timedelta | None:
    """``metrics_history``: True keeps :data:`DEFAULT_RETENTION`, a timedelta
    (at least a minute, the history's step) that long, False none."""
    if value is False:
        return None
    if value is True:
        return DEFAULT_RETENTION
    if not isinstance(value, timedelta):
        raise TypeError(
            "metrics_history must be True, False or a datetime.timedelta, "
            f"got {value.__class__.__name__}"
        )
    if value < timedelta(minutes=1):
        raise ValueError(f"metrics_history must be at least 1 minute, got {value}")
    return value
