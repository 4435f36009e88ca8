"""Durations: the one module that parses, checks and converts them.

- **Go's text**, exactly: :func:`parse_go_duration` / :func:`go_duration` are Go's
  ``time.ParseDuration`` / ``Duration.String`` (scheduler entries' option strings, the
  gateway, ``@every`` cron specs); :func:`parse_cli_duration` is the same grammar for
  the CLI's flags, never negative, with errors that show a valid form.
- **Whole seconds, as asynq stores them** (``timeout``, ``retention``, TTLs are int64
  seconds): :func:`whole_seconds` one way, :func:`from_stored_seconds` back.
- **Checked options**: :func:`non_negative` (an optional timedelta option),
  :func:`positive_seconds` (a server interval), :func:`wait_seconds` (a wait's
  timeout or poll interval, as a timedelta or seconds), :func:`ttl_seconds` (a TTL as seconds or a
  timedelta). Each error names the option as the user wrote it.
- **Short text** for people: :func:`format_short` (``850ms``, ``4m30s``, ``2d4h``),
  shared by the CLI's tables and the web UI.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

__all__ = [
    "coerce_duration",
    "format_go_duration_ns",
    "format_short",
    "from_stored_seconds",
    "go_duration",
    "non_negative",
    "parse_cli_duration",
    "parse_go_duration",
    "parse_go_duration_ns",
    "positive_seconds",
    "ttl_seconds",
    "wait_seconds",
    "whole_seconds",
]

_NS_PER_US = 1_000
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000
_MAX_NS = (1 << 63) - 1
_MIN_NS = -(1 << 63)

_US = timedelta(microseconds=1)
_SECOND = timedelta(seconds=1)


# -- Go's time.Duration -------------------------------------------------------------------


def _frac(v: int, prec: int) -> tuple[str, int]:
    """Go's fmtFrac: the fraction of v / 10**prec without trailing zeros, and the rest."""
    digits: list[str] = []
    printing = False
    for _ in range(prec):
        digit = v % 10
        printing = printing or digit != 0
        if printing:
            digits.append(str(digit))
        v //= 10
    if not printing:
        return "", v
    return "." + "".join(reversed(digits)), v


def format_go_duration_ns(ns: int) -> str:
    """Go's ``time.Duration(ns).String()``."""
    if not _MIN_NS <= ns <= _MAX_NS:
        raise ValueError(f"duration of {ns} ns does not fit Go's time.Duration (±292 years)")
    u = -ns if ns < 0 else ns
    sign = "-" if ns < 0 else ""
    if u < _NS_PER_S:
        if u == 0:
            return "0s"
        if u < _NS_PER_US:
            prec, unit = 0, "ns"
        elif u < _NS_PER_MS:
            prec, unit = 3, "µs"  # U+00B5 MICRO SIGN, as Go writes it
        else:
            prec, unit = 6, "ms"
        frac, u = _frac(u, prec)
        return f"{sign}{u}{frac}{unit}"
    frac, u = _frac(u, 9)
    out = f"{u % 60}{frac}s"
    u //= 60
    if u > 0:
        out = f"{u % 60}m{out}"
        u //= 60
        if u > 0:
            out = f"{u}h{out}"
    return sign + out


def go_duration(value: object, name: str = "duration") -> str:
    """Format like Go's ``time.Duration.String()``: ``1h2m3s``, ``30m0s``, ``1.5s``, ``500ms``.

    *name* is the option's name in the TypeError a value that is not a timedelta raises.
    """
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a timedelta, got {value.__class__.__name__}")
    return format_go_duration_ns((value // _US) * _NS_PER_US)


_UNITS: dict[str, int] = {
    "ns": 1,
    "us": _NS_PER_US,
    "µs": _NS_PER_US,  # U+00B5 micro sign
    "μs": _NS_PER_US,  # U+03BC Greek mu
    "ms": _NS_PER_MS,
    "s": _NS_PER_S,
    "m": 60 * _NS_PER_S,
    "h": 3600 * _NS_PER_S,
}


def parse_go_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration``, in nanoseconds (same grammar, errors and rounding)."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {text.__class__.__name__}")
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            raise ValueError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and "0" <= s[i] <= "9":
            i += 1
        pre = i > 0
        v = int(s[:i]) if pre else 0
        if v > 1 << 63:
            raise ValueError(f"invalid duration {text!r}")
        s = s[i:]
        f, scale, post = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            i = 0
            overflow = False
            while i < len(s) and "0" <= s[i] <= "9":
                if not overflow:
                    y = f * 10 + int(s[i])
                    if f > _MAX_NS // 10 or y > 1 << 63:
                        overflow = True
                    else:
                        f = y
                        scale *= 10
                i += 1
            post = i > 0
            s = s[i:]
        if not pre and not post:
            raise ValueError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        if i == 0:
            raise ValueError(f"missing unit in duration {text!r}")
        unit_text, s = s[:i], s[i:]
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise ValueError(f"unknown unit {unit_text!r} in duration {text!r}")
        if v > (1 << 63) // unit:
            raise ValueError(f"invalid duration {text!r}")
        v *= unit
        if f > 0:
            # Go converts through float64 here; do the same to round identically.
            v += int(float(f) * (float(unit) / scale))
            if v > 1 << 63:
                raise ValueError(f"invalid duration {text!r}")
        total += v
        if total > 1 << 63:
            raise ValueError(f"invalid duration {text!r}")
    if neg:
        return -total
    if total > _MAX_NS:
        raise ValueError(f"invalid duration {text!r}")
    return total


def parse_go_duration(text: str) -> timedelta:
    """Parse a Go duration string (``"1h30m"``, ``"1.5s"``, ``"-2ms"``) into a timedelta.

    Sub-microsecond parts are truncated toward zero (timedelta has no nanoseconds).
    """
    ns = parse_go_duration_ns(text)
    us = abs(ns) // _NS_PER_US
    return timedelta(microseconds=-us if ns < 0 else us)


_CLI_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_cli_duration(text: str) -> timedelta:
    """A CLI flag's duration (``30s``, ``5m``, ``1h30m``, ``1.5s``, ``500ms``): Go's grammar,
    never negative. Raises ValueError naming the problem and showing a valid form."""
    s = text.strip()
    if s.startswith("-"):
        raise ValueError(f"invalid duration {text!r}: must not be negative")
    if not s.removeprefix("+"):
        raise ValueError("invalid duration '': expected e.g. 30s, 5m or 1h30m")
    try:
        return parse_go_duration(s)
    except ValueError:
        pass
    body = s.removeprefix("+")
    if re.fullmatch(r"(?:" + _CLI_PART.pattern + r")*\d+(\.\d*)?", body):
        raise ValueError(f"invalid duration {text!r}: missing unit (e.g. 30s, 5m or 1h30m)")
    if re.fullmatch(r"(?:" + _CLI_PART.pattern + r")+", body):
        raise ValueError(
            f"invalid duration {text!r}: too large (a duration holds at most "
            "2562047h47m16s, about 292 years)"
        )
    raise ValueError(
        f"invalid duration {text!r}: expected numbers with units ns, us, ms, s, m, h "
        "(e.g. 30s, 5m or 1h30m)"
    )


def coerce_duration(value: Any) -> Any:
    """Seconds (int/float) or a Go duration string -> timedelta; other values pass through.

    Strings that are not Go durations are left for pydantic's own timedelta
    parsing (ISO 8601 ``PT1M30S``, ``HH:MM:SS``), which names the field when
    they are not durations either.
    """
    if isinstance(value, bool):
        raise ValueError("expected seconds or a duration string such as '90s', not a boolean")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("duration must be a finite number of seconds")
        try:
            return timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"duration is out of range: {value} seconds") from None
    if isinstance(value, str):
        try:
            return parse_go_duration(value.strip())
        except ValueError:
            pass  # not Go's syntax: pydantic tries ISO 8601 and names the field if that fails
    return value


# -- whole seconds, as asynq stores them ----------------------------------------------------


def whole_seconds(value: timedelta) -> int:
    """Whole seconds of a duration, truncated toward zero like Go's ``int64(d.Seconds())``.

    Integer division, not ``total_seconds()``: the float rounds values near
    ``timedelta.max`` up past what a timedelta (and so TaskInfo) can hold.
    Every timedelta fits asynq's int64 seconds this way.
    """
    whole = abs(value) // _SECOND
    return whole if value >= timedelta(0) else -whole


def from_stored_seconds(seconds: int) -> timedelta | None:
    """Stored seconds as a timedelta (0: None), clamped to timedelta's range."""
    if not seconds:
        return None
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        return timedelta.max if seconds > 0 else timedelta.min


# -- checked options --------------------------------------------------------------------


def non_negative(value: object, name: str) -> timedelta | None:
    """An optional duration option: None, or a timedelta of zero or more."""
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {type(value).__name__}")
    if value < timedelta(0):
        raise ValueError(f"{name} cannot be negative, got {value!r}")
    return value


def positive_seconds(value: object, name: str, *, minimum: timedelta = timedelta(0)) -> float:
    """*value* in seconds: a timedelta above zero and at least *minimum*."""
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {value.__class__.__name__}")
    if value <= minimum and minimum == timedelta(0):
        raise ValueError(f"{name} must be positive, got {value}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value.total_seconds()


def wait_seconds(value: timedelta | float | None, name: str) -> float | None:
    """A wait's timeout or poll interval given as a timedelta or seconds, as seconds
    (None: no limit)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        kind = type(value).__name__
        raise TypeError(f"{name} must be a datetime.timedelta or seconds, got {kind}")
    if value < 0:
        raise ValueError(f"{name} cannot be negative, got {value}")
    return float(value)


def ttl_seconds(value: float | timedelta, name: str) -> int:
    """Whole seconds of a TTL given as seconds or a timedelta (Go truncates); never negative."""
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if secs < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return int(secs)


# -- short text -------------------------------------------------------------------------


def format_short(d: timedelta) -> str:
    """A compact duration, its two largest units: ``0s``, ``850ms``, ``45s``, ``4m30s``,
    ``3h5m``, ``2d4h``."""
    total = d.total_seconds()
    sign = "-" if total < 0 else ""
    total = abs(total)
    if total < 1:
        return f"{sign}{round(total * 1000)}ms" if total else "0s"
    secs = int(total)
    days, rem = divmod(secs, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, seconds = divmod(rem, 60)
    if days:
        return f"{sign}{days}d{hours}h" if hours else f"{sign}{days}d"
    if hours:
        return f"{sign}{hours}h{minutes}m" if minutes else f"{sign}{hours}h"
    if minutes:
        return f"{sign}{minutes}m{seconds}s" if seconds else f"{sign}{minutes}m"
    return f"{sign}{seconds}s"
