"""Go-compatible formatting for the option strings asynq stores in scheduler entries.

``SchedulerEntry.enqueue_options`` holds each enqueue option as Go's
``Option.String()`` renders it (``MaxRetry(3)``, ``Queue("critical")``,
``Timeout(30m0s)``, ...), and asynq's Inspector parses them back. This module
reproduces Go's ``time.UnixDate`` formatting/parsing and ``strconv.Quote``/``Unquote`` so the
strings asyncq writes are exactly the ones a Go scheduler would write; Go's
``time.Duration`` text is :mod:`asyncq._duration`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from asyncq._duration import go_duration, parse_go_duration
from asyncq._time import require_aware
from asyncq.task import EnqueueOptions

__all__ = [
    "go_quote",
    "go_unix_date",
    "go_unquote",
    "option_strings",
    "parse_go_unix_date",
    "parse_option_string",
    "parse_option_strings",
]

# -- time.UnixDate ------------------------------------------------------------------------

_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_PY_FIXED_ZONE = re.compile(r"UTC[+-]\d\d:\d\d(:\d\d(\.\d+)?)?")


def _zone_abbrev(value: datetime) -> str:
    name = value.tzname()
    if name and not _PY_FIXED_ZONE.fullmatch(name):
        return name
    # An unnamed fixed offset: Go prints the numeric -0700 form.
    offset = value.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    minutes = abs(minutes)
    return f"{sign}{minutes // 60:02d}{minutes % 60:02d}"


def go_unix_date(value: datetime) -> str:
    """Format like Go's ``t.Format(time.UnixDate)``: ``Mon Jan  2 15:04:05 MST 2006``.

    The time is written in its own zone; naive datetimes are rejected.
    """
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {value.__class__.__name__}")
    require_aware(value, "datetime")
    return (
        f"{_WEEKDAYS[value.weekday()]} {_MONTHS[value.month - 1]} {value.day:>2} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d} "
        f"{_zone_abbrev(value)} {value.year:04d}"
    )


_UNIX_DATE = re.compile(
    r"(?P<wd>Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2})  ?(?P<day>\d{1,2}) "
    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?P<frac>\.\d+)? (?P<zone>\S+) (?P<year>\d{4})"
)
_GMT_OFFSET = re.compile(r"GMT([+-]\d{1,2})")


def parse_go_unix_date(text: str) -> datetime:
    """Parse a Go ``time.UnixDate`` string into an aware datetime.

    ``UTC`` and ``GMT±h`` zones are exact. Any other abbreviation (``CET``,
    ``PST``) is read with a zero offset, as Go's ``time.Parse`` does unless the
    abbreviation happens to be its local zone's; asyncq itself writes UTC.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {text.__class__.__name__}")
    match = _UNIX_DATE.fullmatch(text)
    if match is None or match["mon"] not in _MONTHS:
        raise ValueError(
            f"cannot parse {text!r} as Go time.UnixDate (Mon Jan _2 15:04:05 MST 2006)"
        )
    zone = match["zone"]
    tz: timezone = UTC
    if (gmt := _GMT_OFFSET.fullmatch(zone)) is not None:
        tz = timezone(timedelta(hours=int(gmt[1])), zone)
    elif zone not in ("UTC", "GMT"):
        tz = timezone(timedelta(0), zone)
    frac = match["frac"]
    microsecond = int((frac[1:] + "000000")[:6]) if frac else 0
    try:
        return datetime(
            int(match["year"]),
            _MONTHS.index(match["mon"]) + 1,
            int(match["day"]),
            int(match["h"]),
            int(match["m"]),
            int(match["s"]),
            microsecond,
            tzinfo=tz,
        )
    except ValueError as exc:
        raise ValueError(f"cannot parse {text!r} as Go time.UnixDate: {exc}") from None


# -- strconv.Quote ------------------------------------------------------------------------

_SIMPLE_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    '"': r"\"",
    "\\": r"\\",
}


def go_quote(value: str) -> str:
    """Go's ``strconv.Quote`` (the ``%q`` verb) for a string."""
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {value.__class__.__name__}")
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
        elif ch.isprintable():
            # Python's printable set is Go's unicode.IsPrint: letters, marks,
            # numbers, punctuation, symbols and the ASCII space.
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")  # Go has no lone surrogates: invalid runes become U+FFFD
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_UNESCAPE = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


def go_unquote(text: str) -> str:
    """Go's ``strconv.Unquote`` for double-quoted and back-quoted strings."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {text.__class__.__name__}")
    if len(text) >= 2 and text[0] == text[-1] == "`":
        body = text[1:-1]
        if "`" in body:
            raise ValueError(f"invalid Go string literal {text!r}")
        return body.replace("\r", "")
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError(f"invalid Go string literal {text!r}: expected a quoted string")
    body = text[1:-1]
    buf = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch in ('"', "\n"):
            raise ValueError(f"invalid Go string literal {text!r}")
        if ch != "\\":
            buf += ch.encode("utf-8", "surrogatepass")
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError(f"invalid Go string literal {text!r}: trailing backslash")
        esc = body[i + 1]
        i += 2
        if esc in _UNESCAPE:
            buf.append(_UNESCAPE[esc])
        elif esc in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = body[i : i + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"invalid \\{esc} escape in Go string literal {text!r}")
            i += width
            code = int(digits, 16)
            if esc == "x":
                buf.append(code)
            elif code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise ValueError(f"invalid code point in Go string literal {text!r}")
            else:
                buf += chr(code).encode()
        elif esc in "01234567":
            digits = body[i - 1 : i + 2]
            if len(digits) != 3 or not all(c in "01234567" for c in digits):
                raise ValueError(f"invalid octal escape in Go string literal {text!r}")
            code = int(digits, 8)
            if code > 255:
                raise ValueError(f"invalid octal escape in Go string literal {text!r}")
            buf.append(code)
            i += 2
        else:
            raise ValueError(f"invalid escape \\{esc} in Go string literal {text!r}")
    try:
        return buf.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"Go string literal {text!r} is not valid UTF-8") from None


# -- asynq Option.String() ----------------------------------------------------------------


def _go_json(value: Any) -> str:
    """``json.Marshal`` output: compact, UTF-8, with Go's HTML-safe escapes."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean_str(value: str) -> str:
    # Go strings hold UTF-8; invalid runes (lone surrogates here) become U+FFFD.
    return _SURROGATE.sub("\ufffd", value)


def _utc_date(value: object, name: str) -> str:
    # Written in UTC: Go's time.Parse(time.UnixDate) only knows the offset of
    # "UTC" and of the reader's local zone, so UTC is the one unambiguous choice.
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {value.__class__.__name__}")
    return go_unix_date(require_aware(value, name).astimezone(UTC))


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value.__class__.__name__}")
    return go_quote(value)


def option_strings(options: EnqueueOptions | Mapping[str, object]) -> list[str]:
    """asynq's ``Option.String()`` forms for *options*, in the given order.

    ``None`` values are skipped; each header becomes one ``Header(["k","v"])``.
    Datetimes are written in UTC.
    """
    out: list[str] = []
    for name, value in options.items():
        if value is None:
            continue
        if name == "max_retry":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"max_retry must be an int, got {value.__class__.__name__}")
            out.append(f"MaxRetry({value})")
        elif name == "queue":
            out.append(f"Queue({_text(value, name)})")
        elif name == "timeout":
            out.append(f"Timeout({go_duration(value, name)})")
        elif name == "deadline":
            out.append(f"Deadline({_utc_date(value, name)})")
        elif name == "unique":
            out.append(f"Unique({go_duration(value, name)})")
        elif name == "process_at":
            out.append(f"ProcessAt({_utc_date(value, name)})")
        elif name == "process_in":
            out.append(f"ProcessIn({go_duration(value, name)})")
        elif name == "task_id":
            out.append(f"TaskID({_text(value, name)})")
        elif name == "retention":
            out.append(f"Retention({go_duration(value, name)})")
        elif name == "group":
            out.append(f"Group({_text(value, name)})")
        elif name == "headers":
            if not isinstance(value, Mapping):
                raise TypeError(f"headers must be a mapping, got {value.__class__.__name__}")
            for key, val in value.items():
                if not isinstance(key, str) or not isinstance(val, str):
                    raise TypeError("header keys and values must be str")
                out.append(f"Header({_go_json([_clean_str(key), _clean_str(val)])})")
        else:
            raise ValueError(f"unknown enqueue option {name!r}")
    return out


_OPTION = re.compile(r"(?P<name>[A-Za-z]+)\((?P<arg>.*)\)", re.DOTALL)
_IGNORED = ("TaskID", "Group")


def parse_option_string(text: str) -> tuple[str, Any] | None:
    """Parse one ``Option.String()`` form into ``(EnqueueOptions key, value)``.

    Returns None for ``TaskID(...)`` and ``Group(...)``, which asynq's Inspector
    does not parse either. Raises ValueError for anything else it cannot read.
    """
    match = _OPTION.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"cannot parse option string {text!r}")
    name, arg = match["name"], match["arg"]
    try:
        if name in _IGNORED:
            return None
        if name == "Queue":
            return "queue", go_unquote(arg)
        if name == "MaxRetry":
            if not re.fullmatch(r"[+-]?\d+", arg):
                raise ValueError("not an integer")
            return "max_retry", max(int(arg), 0)  # asynq's MaxRetry clamps n < 0 to 0
        if name == "Timeout":
            return "timeout", parse_go_duration(arg)
        if name == "Deadline":
            return "deadline", parse_go_unix_date(arg)
        if name == "Unique":
            return "unique", parse_go_duration(arg)
        if name == "ProcessAt":
            return "process_at", parse_go_unix_date(arg)
        if name == "ProcessIn":
            return "process_in", parse_go_duration(arg)
        if name == "Retention":
            return "retention", parse_go_duration(arg)
        if name == "Header":
            pair = json.loads(arg)
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
            ):
                raise ValueError('expected a JSON array ["key","value"]')
            return "headers", (pair[0], pair[1])
    except ValueError as exc:
        raise ValueError(f"cannot parse option string {text!r}: {exc}") from None
    raise ValueError(f"cannot parse option string {text!r}: unknown option {name!r}")


def parse_option_strings(strings: Iterable[str], *, strict: bool = True) -> EnqueueOptions:
    """The inverse of :func:`option_strings` (asynq Inspector's ``parseOption``).

    ``TaskID`` and ``Group`` are dropped as in asynq; later options win and
    headers accumulate. With ``strict=False`` unreadable strings are skipped
    (asynq's behaviour) instead of raising ValueError.
    """
    result: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for text in strings:
        try:
            parsed = parse_option_string(text)
        except ValueError:
            if strict:
                raise
            continue
        if parsed is None:
            continue
        key, value = parsed
        if key == "headers":
            headers[value[0]] = value[1]
        else:
            result[key] = value
    if headers:
        result["headers"] = headers
    options: EnqueueOptions = result  # type: ignore[assignment]  # keys come from the table above
    return options
