"""Cron specs: the robfig/cron v3 language asynq uses, time zones and DST."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncq._scheduling.cron import CronSchedule, EverySchedule, normalize_spec, parse_cronspec

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
SYDNEY = ZoneInfo("Australia/Sydney")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # 30-minute DST shift


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ticks(spec: str, after: datetime, n: int, location=UTC) -> list[datetime]:
    """The next *n* ticks, in UTC: an ambiguous local time never compares equal across zones."""
    schedule = parse_cronspec(spec, location)
    out = []
    for _ in range(n):
        after = schedule.next_after(after)
        assert after.tzinfo is schedule.location
        out.append(after.astimezone(UTC))
    return out


def local(got: list[datetime], zone: ZoneInfo, fmt: str = "%H:%M %Z") -> list[str]:
    return [t.astimezone(zone).strftime(fmt) for t in got]


def _gaps(got: list[datetime]) -> list[timedelta]:
    return [b - a for a, b in itertools.pairwise(got)]


@pytest.mark.parametrize(
    ("spec", "after", "expected"),
    [
        ("* * * * *", utc(2024, 1, 1, 0, 0, 30), utc(2024, 1, 1, 0, 1)),
        ("* * * * *", utc(2024, 1, 1, 0, 1), utc(2024, 1, 1, 0, 2)),  # strictly after
        ("*/15 * * * *", utc(2024, 1, 1, 0, 16), utc(2024, 1, 1, 0, 30)),
        ("5/15 * * * *", utc(2024, 1, 1, 0, 6), utc(2024, 1, 1, 0, 20)),  # N/step = N-59/step
        ("0 9 * * mon-fri", utc(2024, 1, 5, 10), utc(2024, 1, 8, 9)),  # Fri 10:00 -> Mon
        ("0 9 * * MON-FRI", utc(2024, 1, 5, 10), utc(2024, 1, 8, 9)),
        ("0 0 1 jan,jul *", utc(2024, 1, 2), utc(2024, 7, 1)),
        ("0 0 * * 7", utc(2024, 1, 1), utc(2024, 1, 7)),  # 7 = Sunday
        ("0 0 ? * *", utc(2024, 1, 1), utc(2024, 1, 2)),
        ("30 4 1,15 * *", utc(2024, 1, 2), utc(2024, 1, 15, 4, 30)),
        # Both day fields restricted: either matches (robfig / Vixie).
        ("0 0 13 * 5", utc(2024, 1, 1), utc(2024, 1, 5)),
        ("0 0 */2 * mon", utc(2024, 1, 1), utc(2024, 1, 3)),
        # One of them a bare star: both must match.
        ("0 0 13 * *", utc(2024, 1, 1), utc(2024, 1, 13)),
        ("0 0 * * 5", utc(2024, 1, 6), utc(2024, 1, 12)),
        ("0 0 29 2 *", utc(2024, 3, 1), utc(2028, 2, 29)),
        ("0 12 31 * *", utc(2024, 4, 1), utc(2024, 5, 31, 12)),
        ("  0   0  *  *  * ", utc(2024, 1, 1, 1), utc(2024, 1, 2)),
        ("@yearly", utc(2024, 3, 1), utc(2025, 1, 1)),
        ("@annually", utc(2024, 3, 1), utc(2025, 1, 1)),
        ("@monthly", utc(2024, 3, 5), utc(2024, 4, 1)),
        ("@weekly", utc(2024, 1, 1), utc(2024, 1, 7)),  # Sunday midnight
        ("@daily", utc(2024, 1, 1, 5), utc(2024, 1, 2)),
        ("@midnight", utc(2024, 1, 1, 5), utc(2024, 1, 2)),
        ("@hourly", utc(2024, 1, 1, 5, 1), utc(2024, 1, 1, 6)),
    ],
)
def test_next_after_utc(spec: str, after: datetime, expected: datetime) -> None:
    assert parse_cronspec(spec).next_after(after) == expected


@pytest.mark.parametrize(
    ("spec", "after", "expected"),
    [
        ("@every 30s", utc(2024, 1, 1, 0, 0, 10), utc(2024, 1, 1, 0, 0, 30)),
        ("@every 30s", utc(2024, 1, 1, 0, 0, 30), utc(2024, 1, 1, 0, 1)),
        ("@every 1m30s", utc(2024, 1, 1, 0, 0, 1), utc(2024, 1, 1, 0, 1, 30)),
        ("@every 1h", utc(2024, 1, 1, 5, 59, 59), utc(2024, 1, 1, 6)),
        ("@every 2000ms", utc(2024, 1, 1, 0, 0, 1), utc(2024, 1, 1, 0, 0, 2)),
        ("@every 7s", datetime.fromtimestamp(70, UTC), datetime.fromtimestamp(77, UTC)),
    ],
)
def test_every_is_aligned_to_the_epoch(spec: str, after: datetime, expected: datetime) -> None:
    schedule = parse_cronspec(spec)
    assert isinstance(schedule, EverySchedule)
    assert schedule.next_after(after) == expected


def test_every_ignores_the_zone_and_start_time() -> None:
    # Every process computes the same ticks, whenever it starts and whatever its zone.
    start = utc(2024, 3, 10, 6, 59, 57)  # around New York's DST change
    expected = [utc(2024, 3, 10, 7), utc(2024, 3, 10, 7, 0, 10), utc(2024, 3, 10, 7, 0, 20)]
    assert ticks("@every 10s", start, 3, NY) == expected
    assert ticks("CRON_TZ=Asia/Tokyo @every 10s", start, 3) == expected
    assert ticks("@every 10s", start - timedelta(seconds=4), 2) == expected[:2]


def test_time_zones() -> None:
    # 09:00 in New York is 14:00 UTC in winter, 13:00 UTC in summer.
    assert parse_cronspec("0 9 * * *", NY).next_after(utc(2024, 1, 15)) == utc(2024, 1, 15, 14)
    assert parse_cronspec("0 9 * * *", NY).next_after(utc(2024, 7, 15)) == utc(2024, 7, 15, 13)
    # The result is in the schedule's zone.
    assert parse_cronspec("0 9 * * *", NY).next_after(utc(2024, 1, 15)).tzinfo is NY
    # Fixed-offset tzinfo works too.
    plus2 = timezone(timedelta(hours=2))
    assert parse_cronspec("0 9 * * *", plus2).next_after(utc(2024, 1, 15)) == utc(2024, 1, 15, 7)


@pytest.mark.parametrize("prefix", ["CRON_TZ", "TZ"])
def test_tz_prefix_overrides_the_location(prefix: str) -> None:
    schedule = parse_cronspec(f"{prefix}=Asia/Tokyo 0 9 * * *", NY)
    assert schedule.location == ZoneInfo("Asia/Tokyo")
    assert schedule.next_after(utc(2024, 1, 1)) == utc(2024, 1, 2, 0)  # 09:00 JST
    assert parse_cronspec(f"{prefix}=Europe/Berlin @daily").next_after(utc(2024, 1, 1)) == utc(
        2024, 1, 1, 23
    )


def test_spring_forward_fixed_time_runs_once_right_after_the_jump() -> None:
    # New York, 2024-03-10: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
    got = ticks("30 2 * * *", utc(2024, 3, 9, 12), 3, NY)
    assert got == [
        utc(2024, 3, 10, 7, 0),  # 03:00 EDT, the first instant after the gap
        utc(2024, 3, 11, 6, 30),  # 02:30 EDT
        utc(2024, 3, 12, 6, 30),
    ]
    # Several fixed times inside the gap collapse into one run.
    assert ticks("0,30 2 * * *", utc(2024, 3, 9, 12), 2, NY) == [
        utc(2024, 3, 10, 7),
        utc(2024, 3, 11, 6),
    ]


def test_spring_forward_wildcard_follows_real_time() -> None:
    got = ticks("*/30 * * * *", datetime(2024, 3, 10, 0, 10, tzinfo=NY), 5, NY)
    assert local(got, NY) == [
        "00:30 EST",
        "01:00 EST",
        "01:30 EST",
        "03:00 EDT",
        "03:30 EDT",
    ]
    assert set(_gaps(got)) == {timedelta(minutes=30)}


def test_fall_back_fixed_time_runs_once() -> None:
    # New York, 2024-11-03: 01:00-02:00 happens twice (EDT, then EST).
    got = ticks("30 1 * * *", utc(2024, 11, 2, 12), 3, NY)
    assert local(got, NY, "%m-%d %H:%M %Z") == [
        "11-03 01:30 EDT",
        "11-04 01:30 EST",
        "11-05 01:30 EST",
    ]


def test_fall_back_wildcard_runs_in_both_copies_of_the_hour() -> None:
    got = ticks("*/30 * * * *", datetime(2024, 11, 3, 0, 10, tzinfo=NY), 7, NY)
    assert local(got, NY) == [
        "00:30 EDT",
        "01:00 EDT",
        "01:30 EDT",
        "01:00 EST",
        "01:30 EST",
        "02:00 EST",
        "02:30 EST",
    ]
    assert ticks("@hourly", utc(2024, 11, 3, 4, 30), 3, NY) == [
        utc(2024, 11, 3, 5),  # 01:00 EDT
        utc(2024, 11, 3, 6),  # 01:00 EST
        utc(2024, 11, 3, 7),  # 02:00 EST
    ]


def test_southern_hemisphere_and_half_hour_shifts() -> None:
    # Sydney falls back on 2024-04-07 03:00 AEDT -> 02:00 AEST.
    assert local(ticks("30 2 * * *", utc(2024, 4, 6, 0), 2, SYDNEY), SYDNEY) == [
        "02:30 AEDT",
        "02:30 AEST",
    ]
    # Lord Howe springs forward 30 minutes on 2024-10-06: 02:00 -> 02:30.
    got = ticks("15 2 * * *", utc(2024, 10, 5, 0), 2, LORD_HOWE)
    assert got[0] == datetime(2024, 10, 6, 2, 30, tzinfo=LORD_HOWE)
    assert got[1] == datetime(2024, 10, 7, 2, 15, tzinfo=LORD_HOWE)


@pytest.mark.parametrize("minute", [1, 6, 7, 15, 29])
def test_a_time_inside_the_gap_runs_at_the_exact_second_of_the_jump(minute: int) -> None:
    # Found by bisection between the two readings of the wall time: to the second,
    # never a second after the jump nor a fraction of one.
    got = ticks(f"{minute} 2 * * *", utc(2024, 10, 5, 0), 1, LORD_HOWE)
    assert got == [datetime(2024, 10, 6, 2, 30, tzinfo=LORD_HOWE)]
    assert got[0].microsecond == 0


@pytest.mark.parametrize(("zone", "year"), [(NY, 2024), (BERLIN, 2025), (SYDNEY, 2024)])
@pytest.mark.parametrize("spec", ["30 2 * * *", "0 1 * * *", "59 23 * * *"])
def test_fixed_daily_job_runs_once_per_local_day_all_year(
    zone: ZoneInfo, year: int, spec: str
) -> None:
    got = ticks(spec, datetime(year, 1, 1, tzinfo=zone), 365, zone)
    days = [t.astimezone(zone).date() for t in got]
    assert days == [date(year, 1, 1) + timedelta(days=i) for i in range(365)]
    assert got == sorted(set(got))


@settings(max_examples=60, deadline=None)
@given(
    start=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1)),
    zone=st.sampled_from([NY, BERLIN, SYDNEY, LORD_HOWE]),
    step=st.sampled_from([1, 5, 15, 20, 30]),
)
def test_wildcard_minute_jobs_tick_at_fixed_real_intervals(
    start: datetime, zone: ZoneInfo, step: int
) -> None:
    got = ticks(f"*/{step} * * * *", start.replace(tzinfo=UTC), 30, zone)
    gaps = set(_gaps(got))
    # Only a 30-minute DST shift can break the grid (Lord Howe); whole-hour shifts never do.
    assert gaps == {timedelta(minutes=step)} or zone is LORD_HOWE


def _matches(schedule: CronSchedule, t: datetime) -> bool:
    dom = t.day in schedule.days
    dow = t.isoweekday() % 7 in schedule.weekdays
    day_ok = (dom and dow) if schedule.day_and else (dom or dow)
    return (
        t.minute in schedule.minutes
        and t.hour in schedule.hours
        and t.month in schedule.months
        and day_ok
    )


_field = st.one_of(
    st.just("*"),
    st.builds(lambda a, b: f"{min(a, b)}-{max(a, b)}", st.integers(0, 5), st.integers(0, 5)),
    st.builds(lambda s: f"*/{s}", st.integers(1, 7)),
)


@settings(max_examples=80, deadline=None)
@given(
    minute=_field,
    hour=st.sampled_from(["*", "1-3", "*/6", "0,12,23"]),
    dom=st.sampled_from(["*", "1-5", "*/3", "31"]),
    month=st.sampled_from(["*", "1-3", "*/2"]),
    dow=st.sampled_from(["*", "1-5", "0", "sat,sun"]),
    start=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1)),
)
def test_next_after_is_the_first_matching_minute_in_utc(
    minute: str, hour: str, dom: str, month: str, dow: str, start: datetime
) -> None:
    schedule = parse_cronspec(f"{minute} {hour} {dom} {month} {dow}")
    assert isinstance(schedule, CronSchedule)
    after = start.replace(tzinfo=UTC)
    got = schedule.next_after(after)
    assert got > after
    assert got.second == 0 and got.microsecond == 0
    assert _matches(schedule, got)
    # No matching minute in between (checked when the gap is small enough to scan).
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    if got - t < timedelta(days=3):
        while t < got:
            assert not _matches(schedule, t), t
            t += timedelta(minutes=1)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty spec"),
        ("   ", "empty spec"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),  # no seconds field, as in asynq
        ("0 0 1 1 * 2025", "expected 5 fields"),
        ("60 * * * *", "out of range"),
        ("* 24 * * *", "out of range"),
        ("* * 0 * *", ""),
        ("* * * 13 *", ""),
        ("*/0 * * * *", "step"),
        ("a b c d e", ""),
        ("5-1 * * * *", "runs backwards"),
        ("0 0 * * fri-mon", "runs backwards"),
        ("0 0 L * *", "day-of-month"),
        ("0 0 15W * *", "day-of-month"),
        ("0 0 * * 1#2", "day-of-week"),
        ("0 0 * * 5L", "day-of-week"),
        ("H * * * *", "minute"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("@fortnightly", "unknown descriptor"),
        ("@daily extra", "unknown descriptor"),
        ("@every", "bad @every duration"),
        ("@every soon", "bad @every duration"),
        ("@every 10", "bad @every duration"),
        ("@every 0s", "at least 1s"),
        ("@every -5s", "at least 1s"),
        ("@every 500ms", "at least 1s"),
        ("@every 1.5s", "whole number of seconds"),
        ("CRON_TZ=Mars/Olympus 0 0 * * *", "unknown time zone 'Mars/Olympus'"),
        ("TZ=../../etc/passwd 0 0 * * *", "unknown time zone"),
        ("CRON_TZ=UTC", "nothing after the time zone"),
    ],
)
def test_bad_specs_raise_value_error_naming_the_spec(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid cron spec") as info:
        parse_cronspec(spec)
    assert repr(spec) in str(info.value)
    assert message in str(info.value)


def test_wrong_types() -> None:
    with pytest.raises(TypeError):
        parse_cronspec(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_cronspec("* * * * *", "UTC")  # type: ignore[arg-type]


def test_naive_after_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_cronspec("* * * * *").next_after(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_cronspec("@every 1s").next_after(datetime(2024, 1, 1))


def test_spec_is_kept_as_written() -> None:
    spec = "CRON_TZ=Europe/Berlin  */5 * * * *"
    assert parse_cronspec(spec).spec == spec
    assert normalize_spec(spec) == "CRON_TZ=Europe/Berlin */5 * * * *"
