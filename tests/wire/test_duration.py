"""asyncq._duration: the conversions every other module now takes from it (whole seconds as
asynq stores them, the checked options, the CLI's flags, the short text)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncq._duration import (
    format_short,
    from_stored_seconds,
    non_negative,
    parse_cli_duration,
    positive_seconds,
    ttl_seconds,
    wait_seconds,
    whole_seconds,
)


@given(st.timedeltas())
def test_whole_seconds_truncates_toward_zero_like_go(value: timedelta) -> None:
    whole = whole_seconds(value)
    micros = value // timedelta(microseconds=1)
    assert abs(whole) * 1_000_000 <= abs(micros) < (abs(whole) + 1) * 1_000_000
    assert whole == 0 or (whole > 0) == (micros > 0)  # toward zero, never past it


def test_whole_seconds_is_exact_at_the_limits() -> None:
    # total_seconds() is a float: it rounds timedelta.max up past what a timedelta holds.
    assert whole_seconds(timedelta.max) == 999_999_999 * 86_400 + 86_399
    assert from_stored_seconds(whole_seconds(timedelta.max)) <= timedelta.max
    assert whole_seconds(timedelta(seconds=-1.5)) == -1
    assert whole_seconds(timedelta(seconds=1.999)) == 1


def test_stored_seconds_back_to_timedelta() -> None:
    assert from_stored_seconds(0) is None
    assert from_stored_seconds(90) == timedelta(seconds=90)
    assert from_stored_seconds(2**63 - 1) == timedelta.max
    assert from_stored_seconds(-(2**63)) == timedelta.min


def test_checked_options_name_the_option() -> None:
    assert non_negative(None, "retention") is None
    assert non_negative(timedelta(0), "retention") == timedelta(0)
    with pytest.raises(TypeError, match=r"retention must be a datetime\.timedelta, got int"):
        non_negative(5, "retention")
    with pytest.raises(ValueError, match="retention cannot be negative"):
        non_negative(timedelta(seconds=-1), "retention")

    assert positive_seconds(timedelta(seconds=2), "lease", minimum=timedelta(seconds=2)) == 2.0
    with pytest.raises(ValueError, match="lease must be positive"):
        positive_seconds(timedelta(0), "lease")
    with pytest.raises(ValueError, match="lease must be at least 0:00:02"):
        positive_seconds(timedelta(seconds=1), "lease", minimum=timedelta(seconds=2))

    assert wait_seconds(None, "timeout") is None
    assert wait_seconds(timedelta(milliseconds=1500), "timeout") == 1.5
    assert wait_seconds(2, "timeout") == 2.0
    with pytest.raises(TypeError, match=r"timeout must be a datetime\.timedelta or seconds"):
        wait_seconds(True, "timeout")
    with pytest.raises(ValueError, match="timeout cannot be negative"):
        wait_seconds(-0.5, "timeout")

    assert ttl_seconds(timedelta(seconds=59.9), "ttl") == 59
    assert ttl_seconds(3.7, "ttl") == 3
    with pytest.raises(ValueError, match="ttl must not be negative"):
        ttl_seconds(-1, "ttl")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-5s", "must not be negative"),
        ("", "expected e.g. 30s"),
        ("+", "expected e.g. 30s"),
        ("5", "missing unit"),
        ("1h5", "missing unit"),
        ("5d", "expected numbers with units"),
        ("1 h", "expected numbers with units"),
        ("2562048h", "too large"),
    ],
)
def test_cli_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cli_duration(text)


def test_cli_duration_takes_go_forms() -> None:
    assert parse_cli_duration(" 0 ") == timedelta(0)
    assert parse_cli_duration("+1m30s") == timedelta(seconds=90)
    assert parse_cli_duration(".5s") == timedelta(milliseconds=500)
    assert parse_cli_duration("250µs") == timedelta(microseconds=250)
    assert parse_cli_duration("2562047h") == timedelta(hours=2562047)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(milliseconds=850), "850ms"),
        (timedelta(seconds=45), "45s"),
        (timedelta(minutes=4, seconds=30), "4m30s"),
        (timedelta(minutes=4), "4m"),
        (timedelta(hours=3, minutes=5, seconds=9), "3h5m"),
        (timedelta(hours=3, seconds=9), "3h"),
        (timedelta(days=2, hours=4, minutes=1), "2d4h"),
        (timedelta(days=2), "2d"),
        (-timedelta(seconds=45), "-45s"),
    ],
)
def test_short_text_keeps_two_units(value: timedelta, text: str) -> None:
    assert format_short(value) == text
