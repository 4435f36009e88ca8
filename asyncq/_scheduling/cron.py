"""Cron specs as asynq's scheduler reads them, with DST-correct next times.

The accepted language is robfig/cron v3's standard parser, which asynq uses:

* five fields ``minute hour day-of-month month day-of-week`` with ``*``, ``?``,
  lists, ranges, steps (``*/5``, ``1-30/2``, ``5/15`` = ``5-59/15``), month and
  weekday names (``jan``, ``mon-fri``); weekday 7 is accepted as Sunday;
* descriptors ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/
  ``@midnight``, ``@hourly`` and ``@every <Go duration>`` (``30s``, ``1m30s``, ``1h``);
* a ``CRON_TZ=<zone>`` or ``TZ=<zone>`` prefix, which overrides the scheduler's zone.

Day-of-month and day-of-week combine as in robfig and Vixie cron: when either
field is a bare ``*``/``?`` both must match, otherwise either may.

Where asyncq differs from asynq, on purpose:

* **Daylight saving time.** asynq (robfig) skips a fixed-time job whose wall
  time falls into a spring-forward gap and runs it twice in a fall-back
  overlap. asyncq follows Vixie/ISC cron instead: in the gap a fixed-time job
  runs once at the first instant after the jump; in the overlap it runs once, at
  the first occurrence. "Wildcard" jobs (minute or hour field starting with
  ``*``, e.g. ``*/15 * * * *`` or ``@hourly``) keep running on real time: no
  catch-up run in the gap, and they run in both copies of the repeated hour.
* **``@every`` ticks are aligned to the Unix epoch** (multiples of the interval
  since 1970-01-01T00:00Z) instead of counting from the scheduler's start, so
  every scheduler process computes the same tick times; that is what lets
  several schedulers share entries with exactly-once ticks. The interval must
  be a whole number of seconds, at least 1 s (robfig silently rounds).
* Specs that can never fire (``0 0 30 2 *``) and 6- or 7-field specs are
  rejected instead of being accepted and never run.

Every bad spec raises ValueError naming the spec.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from asyncq._duration import parse_go_duration
from asyncq._time import require_aware

__all__ = [
    "CronSchedule",
    "EverySchedule",
    "Schedule",
    "normalize_spec",
    "parse_cronspec",
]

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
# Only these characters may appear in a field (names are letters); croniter's
# extensions L, W, # and H are refused so that a spec means the same in asynq.
_FIELD_RE = re.compile(r"^[0-9a-zA-Z*?,/-]+$")
_EXTENSION_RE = re.compile(r"[#]|(?<![a-zA-Z])[lLwWhH](?![a-zA-Z])|\d[lLwW]")
_NAMES = {
    name: number
    for names in (
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        ("sun", "mon", "tue", "wed", "thu", "fri", "sat"),
    )
    for number, name in enumerate(names, start=1 if len(names) == 12 else 0)
}
# Far enough to find Feb 29 even across a skipped leap year (2096 -> 2104).
_HORIZON_YEARS = 10
# Larger than any UTC-offset change at a single transition, so a window of wall
# times this wide around an instant holds every wall time that can map near it.
_MAX_SHIFT = timedelta(hours=4)


def normalize_spec(spec: str) -> str:
    """The spec with runs of whitespace collapsed, as used in entry identities."""
    return " ".join(spec.split())


class Schedule(abc.ABC):
    """When a periodic entry fires: :meth:`next_after` gives the next tick."""

    spec: str
    """The spec as written, including any ``CRON_TZ=`` prefix."""
    location: tzinfo
    """The zone the spec is evaluated in."""

    @abc.abstractmethod
    def next_after(self, after: datetime) -> datetime:
        """The first tick strictly after *after* (aware), in :attr:`location`."""


@dataclass(frozen=True, slots=True, eq=False)
class EverySchedule(Schedule):
    """``@every <duration>``: ticks at whole multiples of *interval* since the Unix epoch."""

    spec: str
    location: tzinfo
    interval: timedelta

    def next_after(self, after: datetime) -> datetime:
        require_aware(after, "after")
        step = int(self.interval.total_seconds())
        now = after.timestamp()
        tick = (math.floor(now / step) + 1) * step
        return datetime.fromtimestamp(tick, tz=UTC).astimezone(self.location)


@dataclass(frozen=True, slots=True, eq=False)
class CronSchedule(Schedule):
    """A five-field cron spec evaluated on wall-clock time in :attr:`location`."""

    spec: str
    location: tzinfo
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    day_and: bool
    """True when day-of-month and day-of-week must both match (one is ``*``)."""
    wildcard: bool
    """Minute or hour field starts with ``*``: the job follows real time across DST."""

    def next_after(self, after: datetime) -> datetime:
        after_utc = require_aware(after, "after").astimezone(UTC)
        local = after_utc.astimezone(self.location).replace(tzinfo=None)
        start = (local - _MAX_SHIFT).replace(second=0, microsecond=0)
        best: datetime | None = None
        best_wall: datetime | None = None
        for wall in self._walls_from(start):
            if best_wall is not None and wall > best_wall + _MAX_SHIFT:
                break
            for instant in self._instants(wall):
                if instant > after_utc and (best is None or instant < best):
                    best = instant
                    best_wall = instant.astimezone(self.location).replace(tzinfo=None)
        if best is None:
            raise ValueError(
                f"cron spec {self.spec!r} has no tick within {_HORIZON_YEARS} years "
                f"after {after.isoformat()}"
            )
        return best.astimezone(self.location)

    def _day_matches(self, day: date) -> bool:
        dom = day.day in self.days
        dow = day.isoweekday() % 7 in self.weekdays
        return (dom and dow) if self.day_and else (dom or dow)

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall times >= *start*, ascending, up to the search horizon."""
        day = start.date()
        limit = start.year + _HORIZON_YEARS
        while day.year <= limit:
            if day.month not in self.months:
                # Jump to the first of the next month.
                day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
                continue
            if self._day_matches(day):
                for hour in self.hours:
                    for minute in self.minutes:
                        wall = datetime.combine(day, time(hour, minute))
                        if wall >= start:
                            yield wall
            day += timedelta(days=1)

    def _instants(self, wall: datetime) -> list[datetime]:
        """The UTC instants at which the wall time *wall* fires (0, 1 or 2 of them)."""
        first = wall.replace(tzinfo=self.location, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=self.location, fold=1).astimezone(UTC)
        if first == second:
            return [first]
        if first.astimezone(self.location).replace(tzinfo=None) == wall:
            # Fall-back overlap: the wall time happens twice.
            return [first, second] if self.wildcard else [first]
        # Spring-forward gap: the wall time never happens.
        if self.wildcard:
            return []
        return [self._transition(min(first, second), max(first, second))]

    def _transition(self, low: datetime, high: datetime) -> datetime:
        """The first instant in (low, high] with *high*'s UTC offset (a DST jump)."""
        target = high.astimezone(self.location).utcoffset()
        lo, hi = int(low.timestamp()), int(high.timestamp())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, tz=UTC).astimezone(self.location).utcoffset() == target:
                hi = mid
            else:
                lo = mid
        return datetime.fromtimestamp(hi, tz=UTC)


def _load_zone(name: str, spec: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"invalid cron spec {spec!r}: unknown time zone {name!r}") from exc


def _parse_every(text: str, spec: str, location: tzinfo) -> EverySchedule:
    try:
        interval = parse_go_duration(text)
    except ValueError as exc:
        raise ValueError(f"invalid cron spec {spec!r}: bad @every duration: {exc}") from exc
    if interval < timedelta(seconds=1):
        raise ValueError(f"invalid cron spec {spec!r}: @every interval must be at least 1s")
    if interval % timedelta(seconds=1):
        raise ValueError(
            f"invalid cron spec {spec!r}: @every interval must be a whole number of seconds"
        )
    return EverySchedule(spec=spec, location=location, interval=interval)


def _is_star(field: str) -> bool:
    """robfig's star bit: a bare ``*``/``?`` (a step above 1 clears it)."""
    base, _, step = field.partition("/")
    return base in ("*", "?") and (not step or step == "1")


def _range_end(text: str) -> int | None:
    if text.isdigit():
        return int(text)
    return _NAMES.get(text.lower())


def _check_ranges(name: str, field: str, spec: str) -> None:
    """Refuse wrap-around ranges (``5-1``, ``fri-mon``): croniter reads them, robfig does not."""
    for part in field.split(","):
        low, sep, high = part.partition("/")[0].partition("-")
        if not sep:
            continue
        start, end = _range_end(low), _range_end(high)
        if start is not None and end is not None and start > end:
            raise ValueError(f"invalid cron spec {spec!r}: {name} range {part!r} runs backwards")


def _expand(fields: list[str], spec: str) -> list[list[int]]:
    for name, field in zip(_FIELD_NAMES, fields, strict=True):
        if not _FIELD_RE.match(field) or _EXTENSION_RE.search(field):
            raise ValueError(f"invalid cron spec {spec!r}: bad {name} field {field!r}")
        _check_ranges(name, field, spec)
    try:
        expanded, nth = croniter.expand(" ".join(fields))
    except (CroniterError, ValueError, KeyError, IndexError) as exc:
        raise ValueError(f"invalid cron spec {spec!r}: {exc}") from exc
    if nth:
        raise ValueError(f"invalid cron spec {spec!r}: '#' weekdays are not supported")
    result: list[list[int]] = []
    for name, values, (low, high) in zip(_FIELD_NAMES, expanded, _FIELD_RANGES, strict=True):
        if values == ["*"]:
            result.append(list(range(low, high + 1)))
            continue
        if not all(isinstance(v, int) for v in values):
            raise ValueError(f"invalid cron spec {spec!r}: unsupported {name} field")
        ints = sorted({int(v) % 7 if name == "day-of-week" else int(v) for v in values})
        if not ints or ints[0] < low or ints[-1] > high:
            raise ValueError(f"invalid cron spec {spec!r}: {name} out of range")
        result.append(ints)
    return result


def parse_cronspec(spec: str, location: tzinfo = UTC) -> Schedule:
    """Parse *spec* like asynq's scheduler; *location* is used unless the spec has ``CRON_TZ=``.

    Raises ValueError naming the spec when it is malformed or can never fire.
    """
    if not isinstance(spec, str):
        raise TypeError(f"cron spec must be a str, got {spec.__class__.__name__}")
    if not isinstance(location, tzinfo):
        raise TypeError(f"location must be a tzinfo, got {location.__class__.__name__}")
    text = spec.strip()
    if not text:
        raise ValueError(f"invalid cron spec {spec!r}: empty spec")
    if text.startswith(("CRON_TZ=", "TZ=")):
        prefix, _, text = text.partition(" ")
        location = _load_zone(prefix.partition("=")[2], spec)
        text = text.strip()
        if not text:
            raise ValueError(f"invalid cron spec {spec!r}: nothing after the time zone")
    if text.startswith("@"):
        word, _, rest = text.partition(" ")
        if word.lower() == "@every":
            return _parse_every(rest.strip(), spec, location)
        if rest.strip() or word.lower() not in _DESCRIPTORS:
            raise ValueError(f"invalid cron spec {spec!r}: unknown descriptor {text!r}")
        text = _DESCRIPTORS[word.lower()]
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(
            f"invalid cron spec {spec!r}: expected 5 fields "
            f"(minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    minutes, hours, days, months, weekdays = _expand(fields, spec)
    schedule = CronSchedule(
        spec=spec,
        location=location,
        minutes=tuple(minutes),
        hours=tuple(hours),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        day_and=_is_star(fields[2]) or _is_star(fields[4]),
        wildcard=fields[0].startswith("*") or fields[1].startswith("*"),
    )
    # A spec like "0 0 30 2 *" parses but would never run; say so now.
    if not any(True for _ in schedule._walls_from(datetime(2000, 1, 1))):
        raise ValueError(f"invalid cron spec {spec!r}: it never fires")
    return schedule
