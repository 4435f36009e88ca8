"""Flow control on the worker side: per-queue concurrency and rate limits.

The limits are enforced inside the dequeue script (``dequeue_queues.lua``):

* ``queue_concurrency`` (fleet-wide): at most N tasks of the queue hold a live
  lease at once, counted over every server in Redis (ZCOUNT of the queue's
  lease set with score >= now, so the expired leases of a dead worker hold
  nothing). A limit stored with ``Inspector.set_limit`` / ``asyncq queue
  limit`` overrides the configured one and is read on every fetch.
* ``local_queue_concurrency`` (this server only): this process runs at most N
  tasks of the queue; the processor passes the room left (N minus what it
  runs) with each fetch.
* ``rate_limits`` (fleet-wide): ``{queue: "N/period"}``, a GCRA token bucket in
  Redis (``asynq:{q}:asyncq:rate``) computed with Redis TIME inside the same
  dequeue script, so every worker shares it; one task every period/N, at most
  B at once, where B (the burst: how many tokens the bucket holds) is N unless
  the rate says ``"N/period burst B"``. In any window of one period at most
  N + B - 1 tasks start: ``"10/s"`` allows up to 19 in one second (10 at once
  from a full bucket, then one every 100 ms), ``"10/s burst 1"`` at most 10.

Each option may name queue patterns (``{"tenant:*": 1}``): every served queue
matching the pattern gets that limit (or rate, or the ordered flag) for itself,
an explicit name winning over a pattern (see :mod:`asyncq._worker.queueset`).

``type_rate_limits`` (fleet-wide, per task type) are checked after the dequeue,
by the processor, against the bucket of :mod:`asyncq._broker.typerate`.
"""

from __future__ import annotations

import re
import types
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from asyncq import _keys as keys
from asyncq._worker.queueset import has_patterns, is_pattern, resolve, validate_pattern

if TYPE_CHECKING:
    from asyncq._worker.queueset import QueueSet

_V = TypeVar("_V")

__all__ = [
    "QueueLimits",
    "Rate",
    "flow_record",
    "parse_rate",
    "validate_limits",
    "validate_ordered",
    "validate_rates",
    "validate_type_rates",
]

TYPE_RATE_MAX_WAIT_US = 1_000_000
"""A task whose type's next token comes within this (1 s) waits for it in its worker
(holding its slot); a later token puts the task back to the retry set instead."""

_PERIODS_US = {
    "s": 1_000_000,
    "sec": 1_000_000,
    "second": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "minute": 60_000_000,
    "h": 3_600_000_000,
    "hour": 3_600_000_000,
}
_RATE = re.compile(r"\s*(\d+)\s*/\s*([a-z]+)(?:\s+burst\s+(\d+))?\s*")


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate limit: *count* tasks per *period_us* microseconds, at most *burst* at once."""

    count: int
    period_us: int
    text: str
    burst: int = 0
    """Tokens the bucket holds (tasks that may start at once); 0 means *count*."""

    def __post_init__(self) -> None:
        if self.burst == 0:
            object.__setattr__(self, "burst", self.count)

    @property
    def interval_us(self) -> int:
        """Microseconds between two tokens (at least 1)."""
        return max(1, self.period_us // self.count)

    def __str__(self) -> str:
        return self.text


def parse_rate(text: str) -> Rate:
    """``"100/s"``, ``"600/min"``, ``"10/h"``, ``"10/s burst 1"`` as a :class:`Rate`;
    anything else raises."""
    if not isinstance(text, str):
        raise TypeError(f"a rate is a string like '100/s', got {text!r}")
    m = _RATE.fullmatch(text.lower())
    if m is None or m.group(2) not in _PERIODS_US:
        raise ValueError(
            f"bad rate {text!r}: expected COUNT/PERIOD with PERIOD one of s, min, h, "
            "optionally followed by 'burst B' (e.g. '100/s', '10/s burst 1')"
        )
    count = int(m.group(1))
    if count < 1:
        raise ValueError(f"bad rate {text!r}: the count must be at least 1")
    if m.group(3) is None:
        return Rate(count, _PERIODS_US[m.group(2)], f"{count}/{m.group(2)}")
    burst = int(m.group(3))
    if burst < 1:
        raise ValueError(f"bad rate {text!r}: the burst must be at least 1")
    text = f"{count}/{m.group(2)}" + ("" if burst == count else f" burst {burst}")
    return Rate(count, _PERIODS_US[m.group(2)], text, burst)


def flow_record(
    fleet: Mapping[str, int],
    local: Mapping[str, int],
    rates: Mapping[str, Rate],
    ordered: Sequence[str],
) -> dict[str, str]:
    """A server's queue flow control as its heartbeat publishes it
    (:func:`asyncq._keys.server_queue_flow_key`)."""
    out = {f"limit:{q}": str(n) for q, n in fleet.items()}
    out |= {f"local:{q}": str(n) for q, n in local.items()}
    out |= {f"rate:{q}": str(rate) for q, rate in rates.items()}
    out |= {f"ordered:{q}": "1" for q in ordered}
    return out


def _check_name(option: str, qname: str) -> None:
    keys.refuse_braces("queue name", qname)
    if is_pattern(qname):
        validate_pattern(option, qname)


def validate_rates(option: str, rates: Mapping[str, str] | None) -> Mapping[str, Rate]:
    """A read-only ``{queue: Rate}``; every bad entry raises naming the problem."""
    if rates is None:
        return types.MappingProxyType({})
    if not isinstance(rates, Mapping):
        raise TypeError(f"{option} must be a mapping of queue name to rate, got {rates!r}")
    out: dict[str, Rate] = {}
    for qname, text in rates.items():
        if not isinstance(qname, str) or not qname.strip():
            raise ValueError(f"{option}: queue names must be non-blank strings, got {qname!r}")
        _check_name(option, qname)
        try:
            out[qname] = text if isinstance(text, Rate) else parse_rate(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{option}: queue {qname!r}: {exc}") from None
    return types.MappingProxyType(out)


def validate_type_rates(option: str, rates: Mapping[str, str] | None) -> Mapping[str, Rate]:
    """A read-only ``{task type: Rate}``; every bad entry raises naming the problem."""
    if rates is None:
        return types.MappingProxyType({})
    if not isinstance(rates, Mapping):
        raise TypeError(f"{option} must be a mapping of task type to rate, got {rates!r}")
    out: dict[str, Rate] = {}
    for type_name, text in rates.items():
        if not isinstance(type_name, str) or not type_name.strip():
            raise ValueError(f"{option}: task types must be non-blank strings, got {type_name!r}")
        keys.refuse_braces("task type", type_name)
        try:
            out[type_name] = text if isinstance(text, Rate) else parse_rate(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{option}: task type {type_name!r}: {exc}") from None
    return types.MappingProxyType(out)


def validate_limits(option: str, limits: Mapping[str, int] | None) -> Mapping[str, int]:
    """A read-only copy of ``{queue: limit}``; every bad entry raises naming the problem."""
    if limits is None:
        return types.MappingProxyType({})
    if not isinstance(limits, Mapping):
        raise TypeError(f"{option} must be a mapping of queue name to limit, got {limits!r}")
    out: dict[str, int] = {}
    for qname, limit in limits.items():
        if not isinstance(qname, str) or not qname.strip():
            raise ValueError(f"{option}: queue names must be non-blank strings, got {qname!r}")
        _check_name(option, qname)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"{option}: queue {qname!r} needs an integer limit >= 0, got {limit!r}"
            )
        out[qname] = limit
    return types.MappingProxyType(out)


def validate_ordered(names: Sequence[str]) -> tuple[str, ...]:
    """``ordered_queues`` as a tuple of names; a bad entry raises naming the problem."""
    if isinstance(names, str) or not isinstance(names, Sequence | Set):
        raise TypeError(f"ordered_queues must be a list of queue names, got {names!r}")
    out = []
    for qname in names:
        if not isinstance(qname, str) or not qname.strip():
            raise ValueError(f"ordered_queues: names must be non-blank strings, got {qname!r}")
        _check_name("ordered_queues", qname)
        out.append(qname)
    return tuple(out)


class QueueLimits:
    """The limits one fetch passes to the dequeue script, and the local running counts."""

    __slots__ = (
        "_fleet",
        "_given",
        "_local",
        "_queues",
        "_rates",
        "_running",
        "_version",
    )

    def __init__(
        self,
        fleet: Mapping[str, int],
        local: Mapping[str, int],
        rates: Mapping[str, Rate] | None = None,
        queues: QueueSet | None = None,
    ) -> None:
        self._given = (dict(fleet), dict(local), dict(rates or {}))
        self._fleet, self._local, self._rates = self._given
        # With patterns the limits are resolved per served queue, again whenever the
        # served set changes; without, the given mappings are used as they are.
        self._queues = queues if has_patterns([k for m in self._given for k in m]) else None
        self._version = -1
        self._running: Counter[str] = Counter()

    def _resolve(self) -> None:
        served = self._queues
        if served is None or served.version == self._version:
            return
        self._version = served.version
        names = served.names()
        self._fleet, self._local, self._rates = (
            _expand(self._given[0], names),
            _expand(self._given[1], names),
            _expand(self._given[2], names),
        )

    def started(self, qname: str) -> None:
        self._running[qname] += 1

    def finished(self, qname: str) -> bool:
        """A task of *qname* ended here: whether that freed room under a server-local limit."""
        running = self._running
        running[qname] -= 1
        if running[qname] <= 0:
            del running[qname]
        self._resolve()
        return qname in self._local

    def running(self, qname: str) -> int:
        """Tasks of *qname* this server runs now."""
        return self._running[qname]

    def for_fetch(self) -> dict[str, tuple[int, ...]] | None:
        """``{queue: (fleet limit, local room[, interval µs, burst])}`` (-1 = none).

        None when nothing is limited."""
        self._resolve()
        if not self._fleet and not self._local and not self._rates:
            return None
        out: dict[str, tuple[int, ...]] = {}
        for qname in self._fleet.keys() | self._local.keys() | self._rates.keys():
            local = self._local.get(qname)
            room = -1 if local is None else max(0, local - self._running[qname])
            entry: tuple[int, ...] = (self._fleet.get(qname, -1), room)
            rate = self._rates.get(qname)
            if rate is not None:
                entry += (rate.interval_us, rate.burst)
            out[qname] = entry
        return out

    def is_limited(self, qname: str) -> bool:
        """Whether *qname* has a limit or a rate here (only a fetch may give its tasks)."""
        self._resolve()
        return qname in self._fleet or qname in self._local or qname in self._rates

    def unlimited(self, names: Sequence[str]) -> list[str]:
        """Those of *names* with no limit or rate here: the only queues a worker may ask
        to be delivered tasks from, since the enqueue that delivers does not know this
        server's limits (the fetch hands them to the dequeue script, :meth:`for_fetch`)."""
        limited = self.for_fetch() or {}
        return [q for q in names if q not in limited]


def _expand(given: Mapping[str, _V], names: Sequence[str]) -> dict[str, _V]:
    """*given* for the concrete *names*: explicit entries, then pattern matches."""
    out = {k: v for k, v in given.items() if not is_pattern(k)}
    for name in names:
        if name not in out:
            value = resolve(given, name)
            if value is not None:
                out[name] = value
    return out
