"""Time conversions between Python objects and asynq's wire units."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = [
    "GO_ZERO_TIME",
    "GO_ZERO_UNIX",
    "from_unix",
    "iso",
    "require_aware",
    "to_unix",
    "utc_from_timestamp",
]

GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
"""Go's zero ``time.Time``; asynq writes it for protobuf timestamps meaning "never"."""
GO_ZERO_UNIX = -62135596800
"""Unix seconds of :data:`GO_ZERO_TIME`."""


def require_aware(value: datetime, name: str) -> datetime:
    """Reject naive datetimes: asyncq never guesses a time zone."""
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise ValueError(
            f"{name} must be a timezone-aware datetime (got naive {value.isoformat()}); "
            "use datetime.now(UTC) or attach a tzinfo"
        )
    return value


def to_unix(value: datetime) -> int:
    """Whole unix seconds of an aware datetime (truncated like Go's ``Time.Unix``)."""
    return int(require_aware(value, "datetime").timestamp() // 1)


_UTC_MAX = datetime.max.replace(tzinfo=UTC)
_UTC_MIN = datetime.min.replace(tzinfo=UTC)


def utc_from_timestamp(ts: float) -> datetime:
    """Unix seconds as an aware UTC datetime, clamped to datetime's range.

    A message may carry a deadline or timeout beyond year 9999 (asyncq's own
    client stores ``timeout=timedelta.max`` as is); such a task still runs.
    """
    try:
        return datetime.fromtimestamp(ts, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return _UTC_MAX if ts > 0 else _UTC_MIN


def from_unix(seconds: int) -> datetime | None:
    """An aware UTC datetime, or None for asynq's 0 ("not set").

    Any int64 is accepted: times beyond datetime's range (which another writer
    may have stored) become ``datetime.max``/``datetime.min`` in UTC rather
    than failing the reader.
    """
    if seconds == 0:
        return None
    return utc_from_timestamp(seconds)


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC (what the JSON of the web API and the CLI's ``--json`` carry), or
    None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat()
