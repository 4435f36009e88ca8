"""The three groups of rarely changed ``Server`` settings (:class:`Intervals`,
:class:`Limits`, :class:`Aggregation`), and the one translation of their deprecated flat
keywords (:class:`GroupedOptions`, e.g. ``heartbeat_interval=``) to group fields,
:func:`regroup`, which the ``Server`` (:func:`asyncq._worker.config.build_config`) and the
``App`` share; :func:`merge_groups` lays options over others, a group field by field.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any, Final, TypeAlias, TypedDict

from asyncq.task import Task

__all__ = [
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "GROUPED_OPTION_NAMES",
    "GROUP_KEYWORDS",
    "Aggregation",
    "GroupAggregator",
    "GroupedOptions",
    "Intervals",
    "Limits",
    "Regrouped",
    "flat_name_warning",
    "merge_groups",
    "overlay",
    "regroup",
]

DEFAULT_MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
"""Default bound on the task bytes a server holds in running handlers (64 MiB)."""

GroupAggregator: TypeAlias = Callable[[str, Sequence[Task]], "Task | Awaitable[Task]"]
"""``aggregator(group, tasks) -> Task``, sync or async: turns a group's tasks into one task.

*tasks* come in the order they joined the group, to the second: asynq scores a
group's tasks by the whole second they were added, so tasks that joined within
the same second come in task-id order, not necessarily in enqueue order.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Intervals:
    """How often the server's background roles act (asynq hard-codes these; the
    defaults are asynq's but for ``task_check``). The name in brackets is the field's
    old flat ``Server`` keyword (deprecated: see :class:`GroupedOptions`)."""

    task_check: timedelta = timedelta(milliseconds=80)
    """[task_check_interval] Longest idle wait between fetches when polling (asynq: 1 s).
    asyncq clients wake idle workers at once; on a single Redis server key tracking of
    the pending lists announces tasks enqueued by Go asynq or redis-cli too, and idle
    workers then poll only every 5 s. Elsewhere this bounds the pickup of those tasks."""
    delayed_task_check: timedelta = timedelta(seconds=5)
    """[delayed_task_check_interval] Longest time between two forwarder passes (scheduled
    and retry tasks); it also passes when the next of those tasks is due."""
    heartbeat: timedelta = timedelta(seconds=5)
    """[heartbeat_interval] Server records and lease extension; shorter than the lease."""
    recoverer: timedelta = timedelta(minutes=1)
    """[recoverer_interval] Longest time between two recoverer checks; it also checks
    at the earliest lease expiry it saw and at least once per lease duration."""
    recoverer_cutoff: timedelta = timedelta(seconds=2)
    """[recoverer_cutoff] How long after expiry a lease is recovered: the allowance for
    clock skew between hosts (asynq: 30 s). Zero is allowed."""
    janitor: timedelta = timedelta(seconds=8)
    """[janitor_interval] Deletion of completed tasks past their retention."""
    health_check: timedelta = timedelta(seconds=15)
    """[health_check_interval] How often ``health_check`` is called."""
    queue_refresh: timedelta = timedelta(seconds=1)
    """[queue_refresh_interval] How often a server with queue patterns re-reads
    ``asynq:queues``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds on what runs, beyond ``concurrency`` (see docs/flow-control.md). Queue
    names may be patterns (each match gets its own limit). Each field's old flat
    ``Server`` keyword has its name (deprecated: see :class:`GroupedOptions`)."""

    queue_concurrency: Mapping[str, int] | None = None
    """``{queue: N}``: at most N tasks of the queue at once across every asyncq server
    (counted in Redis from the live leases; a limit stored with ``Inspector.set_limit``
    overrides it)."""
    local_queue_concurrency: Mapping[str, int] | None = None
    """``{queue: N}``: the same for this server alone."""
    rate_limits: Mapping[str, str] | None = None
    """``{queue: "100/s"}``: a token bucket in Redis shared by every asyncq server
    (periods s, min, h; holds N tokens, or B with ``"N/s burst B"``)."""
    type_rate_limits: Mapping[str, str] | None = None
    """``{task type: "600/min"}``: the same per task type, taken after the dequeue (a
    task without a token goes back to the retry set unrun, without using a retry)."""
    ordered_queues: Sequence[str] = ()
    """Queues this server marks ordered in Redis when it starts (one task at a time
    fleet-wide, in enqueue order, a failed task first; the same flag as ``asyncq queue
    ordered Q on``)."""
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    """Bound on the payload bytes of the running handlers (a larger task runs alone)."""
    sync_concurrency: int | None = None
    """Worker threads for plain ``def`` handlers (None: ``concurrency``)."""
    janitor_batch_size: int = 100
    """Completed tasks deleted per janitor script call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Aggregation:
    """Group aggregation: on when *aggregator* is set. The name in brackets is the
    field's old flat ``Server`` keyword (deprecated: see :class:`GroupedOptions`)."""

    aggregator: GroupAggregator | None = None
    """[group_aggregator] Turns a group's tasks into one task."""
    grace_period: timedelta = timedelta(minutes=1)
    """[group_grace_period] A group is aggregated once no task joined it for this long
    (at least 1 s)."""
    max_delay: timedelta | None = None
    """[group_max_delay] ... or once its oldest task waited this long (None: no limit)."""
    max_size: int | None = None
    """[group_max_size] ... or once it holds this many tasks (None: no limit)."""
    check_interval: timedelta | None = None
    """[group_check_interval] How often groups are checked (None: min(7 s, grace))."""


class GroupedOptions(TypedDict, total=False):
    """The old flat ``Server`` keywords of the grouped settings, each one field of a group.

    Deprecated since 0.2.0, removed in 0.3.0: each still works for this release and
    warns (DeprecationWarning) naming the grouped option to give instead.
    """

    task_check_interval: timedelta
    delayed_task_check_interval: timedelta
    heartbeat_interval: timedelta
    recoverer_interval: timedelta
    recoverer_cutoff: timedelta
    janitor_interval: timedelta
    health_check_interval: timedelta
    queue_refresh_interval: timedelta
    queue_concurrency: Mapping[str, int] | None
    local_queue_concurrency: Mapping[str, int] | None
    rate_limits: Mapping[str, str] | None
    type_rate_limits: Mapping[str, str] | None
    ordered_queues: Sequence[str]
    max_inflight_bytes: int
    sync_concurrency: int | None
    janitor_batch_size: int
    group_aggregator: GroupAggregator | None
    group_grace_period: timedelta
    group_max_delay: timedelta | None
    group_max_size: int | None
    group_check_interval: timedelta | None


_GROUPS: Final[dict[str, tuple[str, type[Any]]]] = {
    # flat keyword: (group field, group)
    **{
        f"{f.name}_interval" if f.name != "recoverer_cutoff" else f.name: (f.name, Intervals)
        for f in fields(Intervals)
    },
    **{f.name: (f.name, Limits) for f in fields(Limits)},
    **{
        "group_aggregator": ("aggregator", Aggregation),
        "group_grace_period": ("grace_period", Aggregation),
        "group_max_delay": ("max_delay", Aggregation),
        "group_max_size": ("max_size", Aggregation),
        "group_check_interval": ("check_interval", Aggregation),
    },
}
GROUPED_OPTION_NAMES: Final = frozenset(GroupedOptions.__annotations__)
"""The deprecated flat names (:class:`GroupedOptions`)."""


_GROUP_KEYWORD: Final[dict[type[Any], str]] = {
    Intervals: "intervals",
    Limits: "limits",
    Aggregation: "aggregation",
}
GROUP_KEYWORDS: Final = tuple(_GROUP_KEYWORD.values())
"""The keywords of the three groups: ``intervals``, ``limits``, ``aggregation``."""
_GROUP_CLASS: Final[dict[str, type[Any]]] = {kw: cls for cls, kw in _GROUP_KEYWORD.items()}


@dataclass(frozen=True, slots=True)
class Regrouped:
    """Some options with their deprecated flat names translated (:func:`regroup`)."""

    options: dict[str, Any]
    """The options without the flat names; a group keyword given is its group (or None)."""
    changes: dict[str, dict[str, Any]]
    """Group keyword -> ``{field: value}`` from the flat names, for every group keyword."""
    flat: tuple[str, ...]
    """The deprecated flat names given, in the order given (the caller warns for each:
    :func:`flat_name_warning`)."""
    names: dict[str, str]
    """For each flat name, the name the user gave that setting by (``heartbeat_interval``
    or ``intervals.heartbeat``), so that an error names what the user wrote."""


def regroup(options: Mapping[str, object]) -> Regrouped:
    """*options* with each deprecated flat name (:class:`GroupedOptions`) taken out and
    translated to the field of its group: the one translation the ``Server`` and the
    ``App`` share. Pure: it warns about nothing (the caller does, at its user's call).

    Raises TypeError if a group keyword is not its group, ValueError if a setting is
    given both ways (the flat name and a group field other than its default).
    """
    for keyword, cls in _GROUP_CLASS.items():
        value = options.get(keyword)
        if value is not None and not isinstance(value, cls):
            raise TypeError(
                f"{keyword} must be an asyncq.{cls.__name__}, got {value.__class__.__name__}"
            )
    changes: dict[str, dict[str, Any]] = {keyword: {} for keyword in GROUP_KEYWORDS}
    names: dict[str, str] = {}
    for name, (attr, cls) in _GROUPS.items():
        keyword = _GROUP_KEYWORD[cls]
        names[name] = f"{keyword}.{attr}"
        if name not in options:
            continue
        group = options.get(keyword)
        if group is not None and getattr(group, attr) != getattr(cls(), attr):
            raise ValueError(f"{name} and {names[name]} are both given; give one of them")
        changes[keyword][attr] = options[name]
        names[name] = name
    return Regrouped(
        options={key: value for key, value in options.items() if key not in _GROUPS},
        changes=changes,
        flat=tuple(name for name in options if name in _GROUPS),
        names=names,
    )


def flat_name_warning(where: str, name: str) -> str:
    """The DeprecationWarning's message for the flat name *name* given to *where*
    (``Server``, ``App``, ``app.server``...)."""
    attr, cls = _GROUPS[name]
    return (
        f"{where}({name}=...) is deprecated and goes in asyncq 0.3.0; give "
        f"{_GROUP_KEYWORD[cls]}=asyncq.{cls.__name__}({attr}=...) instead"
    )


def overlay(base: Any, override: Any) -> Any:
    """The group *base* with the fields *override* sets, a field being set when its value
    differs from the group's default (a field left at its default keeps *base*'s)."""
    if override is None:
        return base
    if base is None:
        return override
    default = type(override)()
    return replace(
        base,
        **{
            f.name: getattr(override, f.name)
            for f in fields(override)
            if getattr(override, f.name) != getattr(default, f.name)
        },
    )


def merge_groups(base: Mapping[str, object], regrouped: Regrouped) -> dict[str, Any]:
    """The options *regrouped* over *base* (options without flat names): a setting
    replaces the base's, but a group is merged field by field: the base's group,
    then the fields the given group sets (:func:`overlay`), then the fields given by
    their flat names. A group keyword given in neither (nor by a flat name) stays out."""
    merged: dict[str, Any] = {**base, **regrouped.options}
    for keyword, cls in _GROUP_CLASS.items():
        group = overlay(base.get(keyword), regrouped.options.get(keyword))
        if regrouped.changes[keyword]:
            group = replace(cls() if group is None else group, **regrouped.changes[keyword])
        if group is not None:
            merged[keyword] = group
    return merged
