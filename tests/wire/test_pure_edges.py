"""Edge cases of the pure modules that mutation testing (``nox -s mutation``) showed no
test pinned: exact error messages, boundary values of the codec, UTC vs local time."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from asyncq import Task
from asyncq._codec import decode_task_message, encode_task_head, encode_task_message
from asyncq._gofmt import option_strings
from asyncq._keys import processed_key, validate_queue_name
from asyncq._producer import compose as compose_module
from asyncq._producer.compose import compose as compose_task
from asyncq._scheduling.cron import parse_cronspec
from asyncq._time import to_unix
from asyncq.proto.asynq import TaskMessage
from tests.support.gofixtures import GoTask

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def local_new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local zone is not UTC (as on a developer laptop)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# -- time and keys ------------------------------------------------------------------------------


def test_to_unix_floors_before_the_epoch_like_go() -> None:
    # Go's Time.Unix() of 1969-12-31T23:59:59.5Z is -1, not 0.
    assert to_unix(datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)) == -1
    assert to_unix(datetime(1970, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)) == 0


def test_naive_datetimes_are_refused_with_the_argument_named() -> None:
    with pytest.raises(ValueError, match=r"^datetime must be a timezone-aware datetime"):
        to_unix(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match=r"^after must be a timezone-aware datetime"):
        parse_cronspec("@every 5s").next_after(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match=r"^stats keys need an aware datetime$"):
        processed_key("q", datetime(2026, 1, 1))


def test_blank_queue_name_message() -> None:
    with pytest.raises(ValueError, match=r"^queue name must contain one or more characters$"):
        validate_queue_name(" ")


def test_daily_keys_use_the_utc_date_whatever_the_local_zone(local_new_york: None) -> None:
    late_evening = datetime(2026, 1, 1, 22, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert processed_key("q", late_evening) == "asynq:{q}:processed:2026-01-02"


def test_every_schedule_in_utc_whatever_the_local_zone(local_new_york: None) -> None:
    sched = parse_cronspec("@every 1h")
    got = sched.next_after(datetime(2026, 3, 8, 6, 30, tzinfo=UTC))
    assert got == datetime(2026, 3, 8, 7, 0, tzinfo=UTC) and got.utcoffset() == timedelta(0)
    assert sched.spec == "@every 1h"


# -- codec ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [127, 128, 129, 255, 16383, 16384])
def test_varint_boundaries_match_go(n: int) -> None:
    msg = TaskMessage(type="t", id="i", queue="q", retry=n, timeout=n, retention=n)
    want = GoTask("t", id="i", queue="q", retry=n, timeout=n, retention=n).encode()
    assert encode_task_message(msg) == want
    assert decode_task_message(want) == msg


@pytest.mark.parametrize(
    "unknown",
    [
        b"\x80\x01\x2a",  # field 16, varint 42
        b"\x81\x01" + bytes(range(8)),  # field 16, fixed64
        b"\x82\x01\x03abc",  # field 16, length-delimited
        b"\x85\x01" + bytes(range(4)),  # field 16, fixed32
    ],
)
def test_unknown_fields_of_every_wire_type_are_kept(unknown: bytes) -> None:
    known = GoTask("t", b"p", id="i", queue="q")
    raw = known.encode() + unknown + b"\x28\x07"  # then field 5 (retry) = 7
    msg = decode_task_message(raw)
    assert (msg.type, msg.payload, msg.id, msg.queue, msg.retry) == ("t", b"p", "i", "q", 7)
    again = encode_task_message(msg)
    assert unknown in again and decode_task_message(again) == msg


@pytest.mark.parametrize("n", [0, 1, 127, 128, 129, 300])
def test_the_hot_paths_head_is_the_codecs_own_at_every_length(n: int) -> None:
    # Type, payload and id lengths on both sides of the one-byte varint, and empty (no field).
    cases = (("t" * n, b"p", "i"), ("t", b"p", "i" * n), ("t" * n, b"p", "i" * n))
    for task_type, payload, task_id in (*cases, ("t", b"p" * n, "i")):
        whole = encode_task_message(TaskMessage(type=task_type, payload=payload, id=task_id))
        assert encode_task_head(task_type, payload, task_id) == whole


def test_unsupported_wire_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="unsupported protobuf wire type 3"):
        decode_task_message(b"\x83\x01")


# -- option composition ---------------------------------------------------------------------------


def compose(task: Task, **options: Any) -> Any:
    return compose_task(task, [options], NOW)


def test_each_task_id_is_the_uuid4_of_its_own_16_random_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every id of a batch uses its own bytes, all 122 random bits of them: exactly what
    # uuid.UUID(bytes=..., version=4) makes of them (the variant digit from its own nibble).
    raw = bytes(range(256)) * 16
    monkeypatch.setattr("asyncq._producer.compose.os.urandom", lambda n: raw[:n])
    monkeypatch.setattr(compose_module, "_ID_POOL", [])
    ids = [compose_module.new_task_id() for _ in range(256)]
    batch = [str(uuid.UUID(bytes=raw[i : i + 16], version=4)) for i in range(0, 4096, 16)]
    assert ids == batch[::-1]  # the pool hands out its last id first


def test_unknown_option_messages_name_where_and_count() -> None:
    one = "unknown enqueue option retries in the enqueue options ("
    with pytest.raises(TypeError, match=re.escape(one)) as raised:
        compose(Task("t"), retries=3)
    assert "did you mean 'max_retry'?" in str(raised.value)
    assert "(known: deadline, group, headers, max_retry, " in str(raised.value)
    two = "unknown enqueue options a, b in the task's options (known: "
    with pytest.raises(TypeError, match=re.escape(two)):
        compose(Task("t", a=1, b=2))  # type: ignore[call-arg]


def test_a_later_level_moves_an_earlier_schedule() -> None:
    at = NOW + timedelta(hours=1)
    moved = compose(Task("t", process_at=at), process_in=timedelta(minutes=5))
    assert moved.process_at == NOW + timedelta(minutes=5)
    moved_back = compose(Task("t", process_in=timedelta(minutes=5)), process_at=at)
    assert moved_back.process_at == at


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"queue": " "}, ValueError, "queue name must contain one or more characters"),
        ({"queue": 5}, TypeError, "queue must be a str, got int"),
        ({"group": ""}, ValueError, "group key cannot be empty"),
        ({"task_id": " "}, ValueError, "task ID cannot be empty"),
        ({"unique": timedelta(milliseconds=10)}, ValueError, "Unique TTL cannot be less than 1s"),
        ({"headers": ["x"]}, TypeError, "headers must be a mapping of str to str, got list"),
        ({"timeout": 5}, TypeError, "timeout must be a datetime.timedelta, got int"),
        ({"deadline": "soon"}, TypeError, "deadline must be a datetime.datetime, got str"),
        ({"max_retry": "3"}, TypeError, "max_retry must be an int, got str"),
        ({"max_retry": 2**31}, ValueError, "max_retry must fit in 32 bits, got 2147483648"),
        (
            {"headers": {"k": 1}},
            TypeError,
            "header keys and values must be str, got str: int for 'k'",
        ),
        (
            {"process_at": NOW, "process_in": timedelta(1)},
            ValueError,
            "give process_at or process_in, not both",
        ),
    ],
)
def test_bad_option_messages(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        compose(Task("t"), **options)


def test_not_a_task_is_named() -> None:
    with pytest.raises(TypeError, match=r"^expected an asyncq Task, got str$"):
        compose_task("t", [], NOW)  # type: ignore[arg-type]


def test_header_option_strings_are_go_json_with_utf8_and_html_escapes() -> None:
    got = option_strings({"headers": {"tënant": "a<b>&c"}})
    assert got == ['Header(["tënant","a\\u003cb\\u003e\\u0026c"])']


def test_max_retry_at_the_int32_limit_is_accepted() -> None:
    assert compose(Task("t"), max_retry=2**31 - 1).message.retry == 2**31 - 1


def test_composed_process_at_is_utc_whatever_the_local_zone(local_new_york: None) -> None:
    local = datetime(2026, 5, 1, 9, 0, tzinfo=timezone(timedelta(hours=-4)))
    c = compose(Task("t"), process_at=local)
    assert c.process_at == local and c.process_at.utcoffset() == timedelta(0)


# -- Go option strings and durations: the edges mutation testing found ---------------------------


def test_a_header_option_is_gos_json_with_its_html_and_line_separator_escapes() -> None:
    from asyncq._gofmt import option_strings

    headers = {"a<b>&": "x\u2028y\u2029z é", "lone": "a\ud800b"}
    assert option_strings({"headers": headers}) == [
        'Header(["a\\u003cb\\u003e\\u0026","x\\u2028y\\u2029z é"])',
        'Header(["lone","a\ufffdb"])',  # Go strings hold UTF-8: an invalid rune is U+FFFD
    ]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"max_retry": "3"}, TypeError, "max_retry must be an int, got str"),
        ({"queue": 5}, TypeError, "queue must be a str, got int"),
        ({"deadline": datetime(2026, 1, 1)}, ValueError, "deadline must be a timezone-aware"),
        ({"unique": 60}, TypeError, "unique must be a timedelta, got int"),
        ({"process_at": datetime(2026, 1, 1)}, ValueError, "process_at must be a timezone-aware"),
        ({"process_in": 60}, TypeError, "process_in must be a timedelta, got int"),
    ],
)
def test_each_bad_option_value_is_named_in_its_error(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    from asyncq._gofmt import option_strings

    with pytest.raises(error, match=f"^{message}"):
        option_strings(options)


@pytest.mark.usefixtures("local_new_york")
def test_option_dates_are_written_in_utc_whatever_the_local_zone() -> None:
    from asyncq._gofmt import option_strings

    at = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert option_strings({"process_at": at}) == ["ProcessAt(Fri May  1 12:00:00 UTC 2026)"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid duration '': expected e.g. 30s, 5m or 1h30m"),
        ("+", "invalid duration '': expected e.g. 30s, 5m or 1h30m"),
        ("+5", "invalid duration '+5': missing unit (e.g. 30s, 5m or 1h30m)"),
    ],
)
def test_a_cli_duration_error_shows_a_valid_form(text: str, message: str) -> None:
    from asyncq._duration import parse_cli_duration

    with pytest.raises(ValueError) as raised:
        parse_cli_duration(text)
    assert str(raised.value) == message


def test_wait_seconds_takes_zero_and_fractions_and_names_a_wrong_type() -> None:
    from asyncq._duration import wait_seconds

    assert wait_seconds(0, "timeout") == 0.0
    assert wait_seconds(0.5, "timeout") == 0.5
    with pytest.raises(TypeError) as raised:
        wait_seconds("5", "timeout")  # type: ignore[arg-type]
    assert str(raised.value) == "timeout must be a datetime.timedelta or seconds, got str"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "1s"), (1.5, "1s"), (0.85, "850ms"), (2 * 3600 + 300, "2h5m"), (7200, "2h")],
)
def test_format_short_at_its_unit_boundaries(seconds: float, text: str) -> None:
    from asyncq._duration import format_short

    assert format_short(timedelta(seconds=seconds)) == text


@pytest.mark.parametrize(
    ("literal", "text"),
    [
        ("``", ""),
        ('"\\u00e9\\U0001F600\\x41\\101"', "é😀AA"),
        ('"\\303\\251"', "é"),  # octal bytes of one UTF-8 character
        ('"\\ue000\\U0010FFFF"', "\ue000\U0010ffff"),  # either side of the excluded ranges
    ],
)
def test_go_unquote_reads_every_escape(literal: str, text: str) -> None:
    from asyncq._gofmt import go_unquote

    assert go_unquote(literal) == text


@pytest.mark.parametrize(
    ("literal", "message"),
    [
        ("x", "invalid Go string literal 'x': expected a quoted string"),
        ('"\\x4X"', "invalid \\x escape in Go string literal '\"\\\\x4X\"'"),
        ('"\\X41"', "invalid escape \\X in Go string literal '\"\\\\X41\"'"),
        ('"\\ud800"', "invalid code point in Go string literal '\"\\\\ud800\"'"),
        ('"\\udfff"', "invalid code point in Go string literal '\"\\\\udfff\"'"),
        ('"\\U00110000"', "invalid code point in Go string literal '\"\\\\U00110000\"'"),
        ('"\\12"', "invalid octal escape in Go string literal '\"\\\\12\"'"),
        ('"\\1X2"', "invalid octal escape in Go string literal '\"\\\\1X2\"'"),
        ('"\\400"', "invalid octal escape in Go string literal '\"\\\\400\"'"),
        ('"\\377"', "Go string literal '\"\\\\377\"' is not valid UTF-8"),
        ('"a\ud800b"', "Go string literal '\"a\\ud800b\"' is not valid UTF-8"),
    ],
)
def test_go_unquote_names_each_bad_literal(literal: str, message: str) -> None:
    from asyncq._gofmt import go_unquote

    with pytest.raises(ValueError) as raised:
        go_unquote(literal)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("tz", "text"),
    [
        (timezone(timedelta(hours=-7)), "Fri May  1 12:00:00 -0700 2026"),
        (timezone(timedelta(hours=5, minutes=30)), "Fri May  1 12:00:00 +0530 2026"),
        (timezone(timedelta(0), "UTC+00:00"), "Fri May  1 12:00:00 +0000 2026"),
    ],
)
def test_go_unix_date_writes_an_unnamed_offset_as_go_does(tz: timezone, text: str) -> None:
    from asyncq._gofmt import go_unix_date

    assert go_unix_date(datetime(2026, 5, 1, 12, 0, tzinfo=tz)) == text


def test_go_unix_date_names_a_naive_datetime() -> None:
    from asyncq._gofmt import go_unix_date

    with pytest.raises(ValueError, match=r"^datetime must be a timezone-aware datetime"):
        go_unix_date(datetime(2026, 5, 1))


@pytest.mark.parametrize(
    ("text", "zone", "offset", "micro"),
    [
        ("Fri May  1 12:00:00 UTC 2026", "UTC", 0, 0),
        ("Fri May  1 12:00:00 GMT 2026", "UTC", 0, 0),
        ("Fri May  1 12:00:00 GMT+3 2026", "GMT+3", 3, 0),
        ("Fri May  1 12:00:00 CET 2026", "CET", 0, 0),
        ("Fri May  1 12:00:00.123456 UTC 2026", "UTC", 0, 123456),
        ("Fri May  1 12:00:00.1234567 UTC 2026", "UTC", 0, 123456),
        ("Fri May  1 12:00:00.5 UTC 2026", "UTC", 0, 500000),
    ],
)
def test_parse_go_unix_date_keeps_the_zone_and_the_fraction(
    text: str, zone: str, offset: int, micro: int
) -> None:
    from asyncq._gofmt import parse_go_unix_date

    parsed = parse_go_unix_date(text)
    assert (parsed.tzname(), parsed.utcoffset(), parsed.microsecond) == (
        zone, timedelta(hours=offset), micro,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"process_in": "1s"}, "process_in must be a timedelta, got str"),
        ({"task_id": 7}, "task_id must be a str, got int"),
        ({"retention": 60}, "retention must be a timedelta, got int"),
    ],
)
def test_more_bad_option_values_are_named(options: dict[str, object], message: str) -> None:
    from asyncq._gofmt import option_strings

    with pytest.raises(TypeError) as raised:
        option_strings(options)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("MaxRetry(x)", "not an integer"),
        ('Header({"k":"v"})', 'expected a JSON array ["key","value"]'),
    ],
)
def test_a_bad_option_string_argument_says_what_was_expected(text: str, message: str) -> None:
    from asyncq._gofmt import parse_option_string

    with pytest.raises(ValueError) as raised:
        parse_option_string(text)
    assert str(raised.value).endswith(f": {message}") or str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "ns"),
    [  # Go's own boundary cases (time_test.go)
        ("9223372036854775807ns", (1 << 63) - 1),
        ("9223372036854775.807us", (1 << 63) - 1),
        ("9223372036s854ms775us807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)),
        ("-9223372036854775.808us", -(1 << 63)),
        ("0.9223372036854775807s", 922337203),
        ("0.100000000000000000000h", 360_000_000_000),
        ("1.0000000000000000000000001s", 1_000_000_000),
        (".5s", 500_000_000),
        ("5.s", 5_000_000_000),
    ],
)
def test_parse_go_duration_at_gos_boundaries(text: str, ns: int) -> None:
    from asyncq._duration import parse_go_duration_ns

    assert parse_go_duration_ns(text) == ns


@pytest.mark.parametrize(
    "text",
    [
        "9223372036854775808ns",
        "9223372036854775.808us",
        "9223372036854ms775us808ns",
        "-9223372036854775809ns",
        "18446744073709551616ns",
        "9223372036854775808.5ns",
        ".s",
        "+.s",
    ],
)
def test_parse_go_duration_refuses_what_go_refuses(text: str) -> None:
    from asyncq._duration import parse_go_duration_ns

    with pytest.raises(ValueError, match=re.escape(f"invalid duration {text!r}")):
        parse_go_duration_ns(text)


@pytest.mark.parametrize(
    ("ns", "text"),
    [(0, "0s"), (1, "1ns"), (-1, "-1ns"), (999_999, "999.999µs"), (1_000_000, "1ms"),
     (-1_000_000, "-1ms"), (1_500_000, "1.5ms"), (-(1 << 63), "-2562047h47m16.854775808s")],
)  # fmt: skip
def test_format_go_duration_like_go(ns: int, text: str) -> None:
    from asyncq._duration import format_go_duration_ns

    assert format_go_duration_ns(ns) == text


def test_go_quote_escapes_control_characters_and_not_the_space() -> None:
    from asyncq._gofmt import go_quote

    assert go_quote("a b\x1f\x7f") == '"a b\\x1f\\x7f"'


def test_a_non_digit_after_a_number_is_read_as_its_unit() -> None:
    from asyncq._duration import parse_go_duration_ns

    with pytest.raises(ValueError) as raised:
        parse_go_duration_ns("1:s")
    assert str(raised.value) == "unknown unit ':s' in duration '1:s'"


def test_ttl_seconds_takes_zero_and_truncates_fractions() -> None:
    from asyncq._duration import ttl_seconds

    assert ttl_seconds(0, "ttl") == 0
    assert ttl_seconds(0.5, "ttl") == 0
    assert ttl_seconds(timedelta(seconds=1.9), "ttl") == 1
