"""asyncq._producer.client (asynq's Client.Enqueue) and asyncq._gofmt (Go option strings)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._duration import (
    format_go_duration_ns,
    go_duration,
    parse_go_duration,
    parse_go_duration_ns,
)
from asyncq._gofmt import (
    go_quote,
    go_unix_date,
    go_unquote,
    option_strings,
    parse_go_unix_date,
    parse_option_strings,
)
from asyncq._producer.client import Client
from asyncq._producer.compose import compose as compose_task
from asyncq.errors import DuplicateTaskError, TaskIdConflictError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskState

UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
NOW = datetime(2030, 5, 17, 12, 0, 0, 250_000, tzinfo=UTC)

# -- Go formatting: tables -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(microseconds=1), "1µs"),
        (timedelta(microseconds=999), "999µs"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=1), "1s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=1, microseconds=1), "1.000001s"),
        (timedelta(minutes=1), "1m0s"),
        (timedelta(minutes=30), "30m0s"),
        (timedelta(minutes=1, seconds=30), "1m30s"),
        (timedelta(hours=1), "1h0m0s"),
        (timedelta(hours=1, minutes=2, seconds=3), "1h2m3s"),
        (timedelta(days=1), "24h0m0s"),
        (timedelta(days=3, hours=1, seconds=0.25), "73h0m0.25s"),
        (timedelta(seconds=-1.5), "-1.5s"),
        (timedelta(microseconds=-20), "-20µs"),
        (timedelta(hours=-2), "-2h0m0s"),
    ],
)
def test_go_duration(value: timedelta, text: str) -> None:
    assert go_duration(value) == text
    assert parse_go_duration(text) == value


def test_go_duration_micro_sign_is_u00b5() -> None:
    assert go_duration(timedelta(microseconds=7)).encode() == b"7\xc2\xb5s"


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (1, "1ns"),
        (999, "999ns"),
        (1_001, "1.001µs"),
        (2**63 - 1, "2562047h47m16.854775807s"),
        (-(2**63), "-2562047h47m16.854775808s"),
    ],
)
def test_go_duration_nanoseconds(ns: int, text: str) -> None:
    assert format_go_duration_ns(ns) == text
    assert parse_go_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("-0", 0),
        ("+5s", 5_000_000_000),
        ("1h30m", 5_400_000_000_000),
        ("1.5h", 5_400_000_000_000),
        (".5s", 500_000_000),
        ("1.s", 1_000_000_000),
        ("300ms", 300_000_000),
        ("2us", 2_000),
        ("2μs", 2_000),  # U+03BC
        ("2µs", 2_000),  # U+00B5
        ("1h1m1s1ms1us1ns", 3_661_001_001_001),
        ("-1.5h", -5_400_000_000_000),
        ("1.0000000001s", 1_000_000_000),  # Go drops what float64 cannot carry
    ],
)
def test_parse_go_duration_grammar(text: str, ns: int) -> None:
    assert parse_go_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid duration"),
        ("-", "invalid duration"),
        ("1", "missing unit"),
        ("h", "invalid duration"),
        (".h", "invalid duration"),
        ("1hh", "unknown unit 'hh'"),
        ("1d", "unknown unit 'd'"),
        ("1.2.3s", "missing unit"),
        ("9223372036854775808ns", "invalid duration"),
        ("3000000h", "invalid duration"),
    ],
)
def test_parse_go_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_go_duration_ns(text)
    assert message in str(info.value)


def test_go_duration_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"does not fit Go's time\.Duration"):
        go_duration(timedelta(days=110_000))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC), "Mon Jan  2 15:04:05 UTC 2006"),
        (datetime(2030, 12, 25, 0, 0, 59, 999_999, tzinfo=UTC), "Wed Dec 25 00:00:59 UTC 2030"),
        (datetime(1, 1, 1, tzinfo=UTC), "Mon Jan  1 00:00:00 UTC 0001"),
        (
            datetime(2024, 7, 12, 1, 2, 3, tzinfo=ZoneInfo("Europe/Berlin")),
            "Fri Jul 12 01:02:03 CEST 2024",
        ),
        (
            datetime(2024, 11, 22, 1, 2, 3, tzinfo=timezone(timedelta(hours=-7))),
            "Fri Nov 22 01:02:03 -0700 2024",
        ),
        (
            datetime(2024, 11, 22, 1, 2, 3, tzinfo=timezone(timedelta(hours=9), "JST")),
            "Fri Nov 22 01:02:03 JST 2024",
        ),
    ],
)
def test_go_unix_date(value: datetime, text: str) -> None:
    assert go_unix_date(value) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mon Jan  2 15:04:05 UTC 2006", datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)),
        ("Mon Jan 2 15:04:05 UTC 2006", datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)),
        ("Mon Jan 02 15:04:05 UTC 2006", datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)),
        ("Mon Jan  2 15:04:05 GMT+3 2006", datetime(2006, 1, 2, 12, 4, 5, tzinfo=UTC)),
        # An abbreviation Go does not know gets offset 0 (as Go does outside that zone).
        ("Fri Jul 12 01:02:03 CEST 2024", datetime(2024, 7, 12, 1, 2, 3, tzinfo=UTC)),
    ],
)
def test_parse_go_unix_date(text: str, expected: datetime) -> None:
    parsed = parse_go_unix_date(text)
    assert parsed == expected
    assert parsed.tzinfo is not None


@pytest.mark.parametrize(
    "text",
    ["", "2006-01-02T15:04:05Z", "Mon Foo  2 15:04:05 UTC 2006", "Mon Feb 30 15:04:05 UTC 2006"],
)
def test_parse_go_unix_date_errors(text: str) -> None:
    with pytest.raises(ValueError, match=r"time\.UnixDate"):
        parse_go_unix_date(text)


def test_go_unix_date_rejects_naive() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        go_unix_date(datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("critical", '"critical"'),
        ("", '""'),
        ('a"b\\c', r'"a\"b\\c"'),
        ("tab\tnl\ncr\rbell\a\b\f\v", r'"tab\tnl\ncr\rbell\a\b\f\v"'),
        ("\x00\x1f\x7f", r'"\x00\x1f\x7f"'),
        ("é ü 中文 😀", '"é ü 中文 😀"'),
        ("\u00a0", r'"\u00a0"'),
        ("\u200b", r'"\u200b"'),
        ("\U000e0001", r'"\U000e0001"'),
        ("\ud800", r'"\ufffd"'),
    ],
)
def test_go_quote(value: str, quoted: str) -> None:
    assert go_quote(value) == quoted


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ('"x"', "x"),
        (r'"\x41\101\u00e9\U0001F600"', "AAé😀"),
        (r'"\xc3\xa9"', "é"),  # \x escapes are bytes
        ("`raw \\n`", "raw \\n"),
    ],
)
def test_go_unquote(literal: str, value: str) -> None:
    assert go_unquote(literal) == value


@pytest.mark.parametrize(
    "literal", ['"', "x", '"a"b"', r'"\q"', r'"\x4"', r'"\xff"', "'a'", r'"\'"']
)
def test_go_unquote_errors(literal: str) -> None:
    with pytest.raises(ValueError):
        go_unquote(literal)


def test_option_strings_asynq_forms() -> None:
    opts: EnqueueOptions = {
        "max_retry": 3,
        "queue": "critical",
        "timeout": timedelta(minutes=30),
        "deadline": datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC),
        "unique": timedelta(hours=1),
        "process_at": datetime(2006, 1, 2, 22, 4, 5, tzinfo=ZoneInfo("Asia/Tokyo")),
        "process_in": timedelta(minutes=1, seconds=30),
        "task_id": "x",
        "retention": timedelta(days=1),
        "group": "g",
        "headers": {"k": "v", "a<b": "c&d"},
    }
    assert option_strings(opts) == [
        "MaxRetry(3)",
        'Queue("critical")',
        "Timeout(30m0s)",
        "Deadline(Mon Jan  2 15:04:05 UTC 2006)",
        "Unique(1h0m0s)",
        "ProcessAt(Mon Jan  2 13:04:05 UTC 2006)",  # written in UTC
        "ProcessIn(1m30s)",
        'TaskID("x")',
        "Retention(24h0m0s)",
        'Group("g")',
        'Header(["k","v"])',
        'Header(["a\\u003cb","c\\u0026d"])',  # Go's json.Marshal HTML-escapes
    ]


def test_option_strings_skip_none_and_reject_unknown() -> None:
    assert option_strings({"queue": None, "max_retry": 0}) == ["MaxRetry(0)"]
    with pytest.raises(ValueError, match="unknown enqueue option 'priority'"):
        option_strings({"priority": 1})
    with pytest.raises(TypeError, match="timeout must be a timedelta"):
        option_strings({"timeout": 5})
    with pytest.raises(ValueError, match="timezone-aware"):
        option_strings({"deadline": datetime(2030, 1, 1)})


def test_parse_option_strings_like_asynq_inspector() -> None:
    parsed = parse_option_strings(
        [
            'Queue("q1")',
            "MaxRetry(-4)",  # asynq's MaxRetry clamps to 0
            "Timeout(1m)",
            'TaskID("ignored")',
            'Group("ignored")',
            'Header(["k","v1"])',
            'Header(["k2","v2"])',
            'Header(["k","v3"])',
            'Queue("q2")',  # later wins
            "ProcessAt(Mon Jan  2 15:04:05 UTC 2006)",
        ]
    )
    assert parsed == {
        "queue": "q2",
        "max_retry": 0,
        "timeout": timedelta(minutes=1),
        "headers": {"k": "v3", "k2": "v2"},
        "process_at": datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC),
    }


@pytest.mark.parametrize(
    "text",
    [
        "Priority(3)",
        "MaxRetry(three)",
        "Queue(critical)",
        "Timeout(5)",
        "Deadline(yesterday)",
        'Header(["only-one"])',
        "Header(nope)",
        "no parens",
    ],
)
def test_parse_option_strings_errors(text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse option string"):
        parse_option_strings([text])
    assert parse_option_strings([text, "MaxRetry(2)"], strict=False) == {"max_retry": 2}


# -- Go formatting: round trips ---------------------------------------------------------------

_GO_NS = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
_DURATIONS = st.timedeltas(
    min_value=timedelta(microseconds=-(2**63 // 1000)),
    max_value=timedelta(microseconds=(2**63 - 1) // 1000),
)
_INSTANTS = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=0))


@given(_GO_NS)
def test_go_duration_ns_round_trip(ns: int) -> None:
    assert parse_go_duration_ns(format_go_duration_ns(ns)) == ns


@given(_DURATIONS)
def test_go_duration_round_trip(value: timedelta) -> None:
    assert parse_go_duration(go_duration(value)) == value


@given(st.text())
def test_go_quote_round_trip(value: str) -> None:
    expected = re.sub("[\ud800-\udfff]", "\ufffd", value)
    assert go_unquote(go_quote(value)) == expected


@given(_INSTANTS)
def test_go_unix_date_round_trip(value: datetime) -> None:
    assert parse_go_unix_date(go_unix_date(value)) == value


@settings(max_examples=200)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "queue": _TEXT,
            "max_retry": st.integers(0, 2**31 - 1),
            "timeout": _DURATIONS,
            "deadline": _INSTANTS,
            "unique": _DURATIONS,
            "process_at": _INSTANTS,
            "process_in": _DURATIONS,
            "task_id": _TEXT,
            "retention": _DURATIONS,
            "group": _TEXT,
            "headers": st.dictionaries(_TEXT, _TEXT, min_size=1, max_size=3),
        },
    )
)
def test_option_strings_round_trip(options: dict[str, Any]) -> None:
    expected = {k: v for k, v in options.items() if k not in ("task_id", "group")}
    assert parse_option_strings(option_strings(options)) == expected


# -- composition (no Redis) -------------------------------------------------------------------


def compose(task: Task, **options: Any) -> Any:
    return compose_task(task, [options], NOW)


def test_defaults_match_asynq() -> None:
    c = compose(Task("email:welcome", b"{}"))
    msg: TaskMessage = c.message
    assert (msg.type, msg.payload, msg.queue, msg.retry) == ("email:welcome", b"{}", "default", 25)
    assert UUID4.fullmatch(msg.id)
    assert msg.timeout == 1800  # 30 min when neither timeout nor deadline is given
    assert (msg.deadline, msg.retention, msg.unique_key, msg.group_key) == (0, 0, "", "")
    assert msg.headers == {}
    assert c.state is TaskState.PENDING


@pytest.mark.parametrize(
    ("options", "timeout", "deadline"),
    [
        ({"timeout": timedelta(seconds=90.7)}, 90, 0),  # truncated like int64(d.Seconds())
        ({"deadline": NOW + timedelta(hours=1)}, 0, int(NOW.timestamp()) + 3600),
        (
            {"timeout": timedelta(minutes=5), "deadline": NOW + timedelta(seconds=10.9)},
            300,
            int(NOW.timestamp()) + 11,  # 12:00:11.15 -> whole seconds, floored like Time.Unix
        ),
        ({"timeout": timedelta(0)}, 1800, 0),  # 0 = not set, as asynq's Timeout(0)
        ({"timeout": None, "deadline": None}, 1800, 0),
    ],
)
def test_timeout_and_deadline(options: dict[str, Any], timeout: int, deadline: int) -> None:
    msg = compose(Task("t"), **options).message
    assert (msg.timeout, msg.deadline) == (timeout, deadline)


def test_unique_key_distinguishes_none_and_empty_payload() -> None:
    none = compose(Task("t", None), unique=timedelta(seconds=1), queue="q").message
    empty = compose(Task("t", b""), unique=timedelta(seconds=1), queue="q").message
    assert none.unique_key == "asynq:{q}:unique:t:"
    assert empty.unique_key == "asynq:{q}:unique:t:d41d8cd98f00b204e9800998ecf8427e"
    assert none.payload == empty.payload == b""


def test_task_options_are_defaults_the_call_overrides() -> None:
    task = Task(
        "t",
        headers={"a": "1", "b": "2"},
        queue="low",
        max_retry=3,
        process_in=timedelta(hours=1),
        retention=timedelta(hours=2),
    )
    c = compose(
        task,
        queue="high",
        process_at=NOW + timedelta(minutes=5),
        headers={"b": "3", "c": "4"},
        retention=None,  # None = not set: the task's default stays
    )
    assert c.message.queue == "high"
    assert c.message.retry == 3
    assert c.message.retention == 7200
    assert c.message.headers == {"a": "1", "b": "3", "c": "4"}
    assert c.process_at == NOW + timedelta(minutes=5)  # the call's process_at replaced process_in
    assert task.headers == {"a": "1", "b": "2"}  # the task is not modified


def test_routing() -> None:
    past = NOW - timedelta(seconds=1)
    assert compose(Task("t"), process_at=past).state is TaskState.PENDING
    assert compose(Task("t"), process_at=NOW).state is TaskState.PENDING  # strictly after now
    assert compose(Task("t"), process_in=timedelta(0)).state is TaskState.PENDING
    assert compose(Task("t"), group="g").state is TaskState.AGGREGATING
    scheduled = compose(Task("t"), group="g", process_in=timedelta(seconds=1))
    assert scheduled.state is TaskState.SCHEDULED  # scheduling wins over grouping
    assert scheduled.message.group_key == "g"


@pytest.mark.parametrize(
    ("task", "options", "error", "message"),
    [
        (Task("t"), {"queue": ""}, ValueError, "queue name must contain one or more characters"),
        (Task("t"), {"queue": "  "}, ValueError, "queue name must contain"),
        (Task("t"), {"queue": 1}, TypeError, "queue must be a str"),
        (Task("t"), {"task_id": " "}, ValueError, "task ID cannot be empty"),
        (Task("t"), {"group": ""}, ValueError, "group key cannot be empty"),
        (Task("t"), {"unique": timedelta(seconds=0.5)}, ValueError, "Unique TTL cannot be less"),
        (Task("t"), {"unique": timedelta(0)}, ValueError, "Unique TTL cannot be less than 1s"),
        (Task("t"), {"unique": 60}, TypeError, "unique must be a datetime.timedelta"),
        (Task("t"), {"max_retry": -1}, ValueError, "max_retry cannot be negative"),
        (Task("t"), {"max_retry": 2**31}, ValueError, "max_retry must fit in 32 bits"),
        (Task("t"), {"max_retry": True}, TypeError, "max_retry must be an int"),
        (Task("t"), {"max_retry": 2.0}, TypeError, "max_retry must be an int"),
        (Task("t"), {"timeout": timedelta(seconds=-1)}, ValueError, "timeout cannot be negative"),
        (Task("t"), {"timeout": timedelta(seconds=0.5)}, ValueError, "at least 1s"),
        (Task("t"), {"timeout": 30}, TypeError, "timeout must be a datetime.timedelta"),
        (Task("t"), {"process_in": timedelta(seconds=-1)}, ValueError, "process_in cannot be"),
        (Task("t"), {"retention": timedelta(seconds=-1)}, ValueError, "retention cannot be"),
        (Task("t"), {"deadline": datetime(2030, 1, 1)}, ValueError, "deadline must be a timezone"),
        (Task("t"), {"process_at": datetime(2030, 1, 1)}, ValueError, "process_at must be a time"),
        (Task("t"), {"process_at": 1_700_000_000}, TypeError, "process_at must be a datetime"),
        (
            Task("t"),
            {"process_at": NOW, "process_in": timedelta(1)},
            ValueError,
            "process_at or process_in, not both",
        ),
        (
            Task("t", process_at=NOW, process_in=timedelta(1)),
            {},
            ValueError,
            "process_at or process_in, not both",
        ),
        (Task("t"), {"headers": {"k": 1}}, TypeError, "header keys and values must be str"),
        (Task("t"), {"headers": ["k"]}, TypeError, "headers must be a mapping"),
        (Task("t"), {"priority": 1}, TypeError, "unknown enqueue option priority"),
        (Task("t", prio=1), {}, TypeError, "in the task's options"),  # type: ignore[call-arg]
    ],
)
def test_validation_errors(
    task: Task, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        compose(task, **options)
    assert message in str(info.value)


def test_blank_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="task typename cannot be empty"):
        Task("  ")
    task = Task("t")
    task.type = " "  # e.g. a handler-side Task re-enqueued after mutation
    with pytest.raises(ValueError, match="task typename cannot be empty"):
        compose(task)
    with pytest.raises(TypeError, match="expected an asyncq Task"):
        compose("email:welcome")  # type: ignore[arg-type]


@given(
    timeout=st.none() | st.timedeltas(timedelta(seconds=1), timedelta(days=30)),
    deadline_in=st.none() | st.timedeltas(timedelta(0), timedelta(days=30)),
)
def test_timeout_rule_property(timeout: timedelta | None, deadline_in: timedelta | None) -> None:
    deadline = None if deadline_in is None else NOW + deadline_in
    msg = compose(Task("t"), timeout=timeout, deadline=deadline).message
    if timeout is None and deadline is None:
        assert msg.timeout == 1800
    else:
        assert msg.timeout == (int(timeout.total_seconds()) if timeout else 0)
    assert msg.deadline == (int(deadline.timestamp()) if deadline else 0)


# -- enqueue against Redis --------------------------------------------------------------------


async def stored(redis: Redis, queue: str, task_id: str) -> tuple[dict[Any, Any], TaskMessage]:
    fields = await redis.hgetall(keys.task_key(queue, task_id))
    return fields, TaskMessage.parse(fields[b"msg"])


async def test_enqueue_pending(client: Client, redis: Redis) -> None:
    before = datetime.now(UTC)
    info = await client.enqueue(Task("email:welcome", b'{"user":1}', headers={"h": "v"}))
    after = datetime.now(UTC)
    assert isinstance(info, TaskInfo)
    assert info.state is TaskState.PENDING
    assert info.queue == "default"
    assert info.max_retry == 25
    assert info.timeout == timedelta(minutes=30)
    assert info.deadline is None and info.retention is None
    assert info.next_process_at is not None and before <= info.next_process_at <= after
    assert info.headers == {"h": "v"}
    assert UUID4.fullmatch(info.id)

    assert await redis.lrange(keys.pending_key("default"), 0, -1) == [info.id.encode()]
    assert await redis.smembers(keys.ALL_QUEUES) == {b"default"}
    fields, msg = await stored(redis, "default", info.id)
    assert set(fields) == {b"msg", b"state", b"pending_since"}
    assert fields[b"state"] == b"pending"
    pending_since = int(fields[b"pending_since"])  # nanoseconds
    assert before.timestamp() * 1e9 - 1e9 <= pending_since <= after.timestamp() * 1e9 + 1e9
    assert msg == TaskMessage(
        type="email:welcome",
        payload=b'{"user":1}',
        headers={"h": "v"},
        id=info.id,
        queue="default",
        retry=25,
        timeout=1800,
    )
    assert await redis.ttl(keys.task_key("default", info.id)) == -1  # task hashes never expire


async def test_enqueue_with_every_option(client: Client, redis: Redis) -> None:
    deadline = datetime(2031, 1, 1, 10, 0, 30, 999_000, tzinfo=ZoneInfo("Europe/Paris"))
    info = await client.enqueue(
        Task("report", b"p"),
        queue="critical",
        max_retry=0,
        timeout=timedelta(seconds=45.9),
        deadline=deadline,
        task_id="my-id",
        retention=timedelta(hours=1),
        headers={"x": "y"},
    )
    assert info.id == "my-id"
    assert info.max_retry == 0
    assert info.timeout == timedelta(seconds=45)
    assert info.deadline == datetime(2031, 1, 1, 9, 0, 30, tzinfo=UTC)
    assert info.retention == timedelta(hours=1)
    _, msg = await stored(redis, "critical", "my-id")
    assert (msg.queue, msg.retry, msg.timeout, msg.retention) == ("critical", 0, 45, 3600)
    assert msg.deadline == int(deadline.timestamp())
    assert await redis.lrange(keys.pending_key("critical"), 0, -1) == [b"my-id"]
    assert await redis.sismember(keys.ALL_QUEUES, "critical")


async def test_enqueue_scheduled(client: Client, redis: Redis) -> None:
    info = await client.enqueue(Task("t"), process_in=timedelta(hours=1), queue="later")
    assert info.state is TaskState.SCHEDULED
    assert info.next_process_at is not None
    score = await redis.zscore(keys.scheduled_key("later"), info.id)
    assert score == int(info.next_process_at.timestamp())
    fields, _ = await stored(redis, "later", info.id)
    assert fields[b"state"] == b"scheduled"
    assert b"pending_since" not in fields
    assert await redis.llen(keys.pending_key("later")) == 0
    assert await redis.sismember(keys.ALL_QUEUES, "later")

    at = datetime.now(UTC) + timedelta(days=2)
    info = await client.enqueue(Task("t"), process_at=at, queue="later")
    assert info.next_process_at == at
    assert await redis.zscore(keys.scheduled_key("later"), info.id) == int(at.timestamp())


async def test_enqueue_process_at_in_the_past_is_pending(client: Client, redis: Redis) -> None:
    info = await client.enqueue(Task("t"), process_at=datetime(2000, 1, 1, tzinfo=UTC))
    assert info.state is TaskState.PENDING
    assert await redis.lrange(keys.pending_key("default"), 0, -1) == [info.id.encode()]


async def test_enqueue_group(client: Client, redis: Redis) -> None:
    before = int(datetime.now(UTC).timestamp())
    info = await client.enqueue(Task("t", b"1"), group="batch-1", queue="agg")
    assert info.state is TaskState.AGGREGATING
    assert info.next_process_at is None
    assert info.group == "batch-1"
    score = await redis.zscore(keys.group_key("agg", "batch-1"), info.id)
    assert score is not None and before <= score <= before + 2
    assert await redis.smembers(keys.all_groups("agg")) == {b"batch-1"}
    fields, msg = await stored(redis, "agg", info.id)
    assert fields[b"state"] == b"aggregating"
    assert fields[b"group"] == b"batch-1"
    assert msg.group_key == "batch-1"
    assert await redis.llen(keys.pending_key("agg")) == 0


async def test_scheduled_group_task_goes_to_scheduled(client: Client, redis: Redis) -> None:
    info = await client.enqueue(Task("t"), group="g", process_in=timedelta(minutes=1))
    assert info.state is TaskState.SCHEDULED
    assert await redis.zscore(keys.scheduled_key("default"), info.id) is not None
    assert not await redis.exists(keys.group_key("default", "g"))
    fields, msg = await stored(redis, "default", info.id)
    assert b"group" not in fields  # only in the message, as asynq does
    assert msg.group_key == "g"


async def test_enqueue_unique(client: Client, redis: Redis) -> None:
    task = Task("sync", b"abc")
    info = await client.enqueue(task, unique=timedelta(hours=1))
    lock = keys.unique_key("default", "sync", b"abc")
    assert await redis.get(lock) == info.id.encode()
    assert 3590 <= await redis.ttl(lock) <= 3600
    fields, msg = await stored(redis, "default", info.id)
    assert fields[b"unique_key"] == lock.encode()
    assert msg.unique_key == lock

    with pytest.raises(DuplicateTaskError):
        await client.enqueue(Task("sync", b"abc"), unique=timedelta(minutes=5))
    assert await redis.llen(keys.pending_key("default")) == 1
    # Another payload, type or queue is another lock.
    await client.enqueue(Task("sync", b"abd"), unique=timedelta(hours=1))
    await client.enqueue(Task("sync", b"abc"), unique=timedelta(hours=1), queue="other")
    # Without unique, the lock does not matter.
    await client.enqueue(Task("sync", b"abc"))
    assert await redis.llen(keys.pending_key("default")) == 3


async def test_unique_none_and_empty_payloads_are_different_locks(client: Client) -> None:
    await client.enqueue(Task("t", None), unique=timedelta(minutes=1))
    await client.enqueue(Task("t", b""), unique=timedelta(minutes=1))
    with pytest.raises(DuplicateTaskError):
        await client.enqueue(Task("t"), unique=timedelta(minutes=1))


async def test_enqueue_unique_scheduled(client: Client, redis: Redis) -> None:
    info = await client.enqueue(
        Task("t", b"x"), process_in=timedelta(hours=2), unique=timedelta(hours=1)
    )
    assert info.state is TaskState.SCHEDULED
    lock = keys.unique_key("default", "t", b"x")
    # The lock lasts until process_at + unique (3 h from now).
    assert 3 * 3600 - 10 <= await redis.ttl(lock) <= 3 * 3600
    fields, _ = await stored(redis, "default", info.id)
    assert fields[b"unique_key"] == lock.encode()
    with pytest.raises(DuplicateTaskError):
        await client.enqueue(Task("t", b"x"), unique=timedelta(seconds=10))


async def test_enqueue_unique_group(client: Client, redis: Redis) -> None:
    info = await client.enqueue(Task("t", b"x"), group="g", unique=timedelta(minutes=10))
    lock = keys.unique_key("default", "t", b"x")
    assert await redis.get(lock) == info.id.encode()
    assert 590 <= await redis.ttl(lock) <= 600
    fields, msg = await stored(redis, "default", info.id)
    assert b"unique_key" not in fields  # AddToGroupUnique never writes it (asynq)
    assert msg.unique_key == lock
    with pytest.raises(DuplicateTaskError):
        await client.enqueue(Task("t", b"x"), group="g", unique=timedelta(minutes=10))


@pytest.mark.parametrize(
    "options",
    [{}, {"process_in": timedelta(minutes=1)}, {"group": "g"}, {"unique": timedelta(minutes=1)}],
)
async def test_task_id_conflict(client: Client, redis: Redis, options: dict[str, Any]) -> None:
    first = await client.enqueue(Task("t", b"1"), task_id="fixed")
    with pytest.raises(TaskIdConflictError):
        await client.enqueue(Task("t", b"2"), task_id="fixed", **options)
    _, msg = await stored(redis, "default", "fixed")
    assert msg.payload == b"1"  # the first task is untouched
    assert first.id == "fixed"
    assert await redis.llen(keys.pending_key("default")) == 1
    assert await redis.zcard(keys.scheduled_key("default")) == 0
    assert not await redis.exists(keys.group_key("default", "g"))


async def test_validation_happens_before_redis(client: Client, redis: Redis) -> None:
    with pytest.raises(ValueError, match="Unique TTL cannot be less than 1s"):
        await client.enqueue(Task("t"), unique=timedelta(milliseconds=10))
    with pytest.raises(ValueError, match="timezone-aware"):
        await client.enqueue(Task("t"), process_at=datetime.now())
    assert await redis.dbsize() == 0


# -- enqueue_many ----------------------------------------------------------------------------


async def test_enqueue_many(client: Client, redis: Redis) -> None:
    await client.enqueue(Task("t"), task_id="taken")
    results = await client.enqueue_many(
        [
            Task("a", b"1"),
            (Task("b", b"2"), {"queue": "other", "task_id": "b-id"}),
            (Task("c"), {"task_id": "taken"}),
            (Task("d"), {"process_in": timedelta(hours=1)}),
            (Task("e"), {"group": "g"}),
            (Task("f"), {"unique": timedelta(minutes=1)}),
            (Task("g"), {"queue": ""}),
            "not a task",  # type: ignore[list-item]
            Task("h", max_retry=1),
        ],
        max_retry=7,
        headers={"batch": "1"},
    )
    assert len(results) == 9
    a, b, c, d, e, f, g, h, i = results
    assert isinstance(a, TaskInfo) and a.state is TaskState.PENDING and a.max_retry == 7
    assert isinstance(b, TaskInfo) and (b.id, b.queue) == ("b-id", "other")
    assert isinstance(c, TaskIdConflictError)
    assert isinstance(d, TaskInfo) and d.state is TaskState.SCHEDULED
    assert isinstance(e, TaskInfo) and e.state is TaskState.AGGREGATING and e.group == "g"
    assert isinstance(f, TaskInfo) and f.state is TaskState.PENDING
    assert isinstance(g, ValueError) and "queue name" in str(g)
    assert isinstance(h, TypeError)
    assert isinstance(i, TaskInfo) and i.max_retry == 7  # batch options override task defaults

    assert await redis.lrange(keys.pending_key("default"), 0, -1) == [
        i.id.encode(),
        f.id.encode(),
        a.id.encode(),
        b"taken",
    ]
    assert await redis.zrange(keys.group_key("default", "g"), 0, -1) == [e.id.encode()]
    assert await redis.get(keys.unique_key("default", "f", None)) == f.id.encode()
    assert await redis.lrange(keys.pending_key("other"), 0, -1) == [b"b-id"]
    assert d.next_process_at is not None
    assert await redis.zscore(keys.scheduled_key("default"), d.id) == int(
        d.next_process_at.timestamp()
    )
    assert await redis.smembers(keys.ALL_QUEUES) == {b"default", b"other"}
    for info, queue in ((a, "default"), (b, "other"), (d, "default")):
        fields, msg = await stored(redis, queue, info.id)
        assert msg.headers == {"batch": "1"}
        assert msg.retry == 7
        assert fields[b"state"] == info.state.value.encode()
    _, taken = await stored(redis, "default", "taken")
    assert taken.type == "t"  # the conflicting item did not overwrite it


async def test_enqueue_many_edge_cases(client: Client, redis: Redis) -> None:
    assert await client.enqueue_many([]) == []
    results = await client.enqueue_many(iter([Task("x")]))
    assert isinstance(results[0], TaskInfo)
    with pytest.raises(TypeError, match="unknown enqueue option"):
        await client.enqueue_many([Task("x")], priority=1)  # type: ignore[call-arg]
    bad_pair = await client.enqueue_many([(Task("x"), {}, {})])  # type: ignore[list-item]
    assert isinstance(bad_pair[0], TypeError)
    assert await redis.llen(keys.pending_key("default")) == 1


# -- lifecycle ------------------------------------------------------------------------------


async def test_owned_connection_is_closed(redis_url: str, redis: Redis) -> None:
    async with Client(redis_url) as c:
        await c.ping()
        info = await c.enqueue(Task("t"))
        pool = c.redis.connection_pool  # type: ignore[union-attr]
        assert any(conn.is_connected for conn in pool._available_connections)
    assert c.closed
    assert not any(conn.is_connected for conn in pool._available_connections)
    with pytest.raises(RuntimeError, match="closed"):
        await c.enqueue(Task("t"))
    with pytest.raises(RuntimeError, match="closed"):
        await c.ping()
    assert await redis.exists(keys.task_key("default", info.id))
    await c.aclose()  # idempotent


async def test_shared_connection_stays_open(redis: Redis) -> None:
    c = Client(redis)
    await c.enqueue(Task("t"))
    await c.aclose()
    assert c.closed
    assert await redis.ping()
    with pytest.raises(RuntimeError, match="closed"):
        await c.enqueue(Task("t"))


async def test_ping_fails_without_redis() -> None:
    from redis.exceptions import ConnectionError

    from tests.support.redis_server import free_port

    async with Client(f"redis://127.0.0.1:{free_port()}") as c:
        with pytest.raises(ConnectionError):
            await c.ping()


async def test_task_ids_are_unique(client: Client) -> None:
    infos = await client.enqueue_many([Task("t") for _ in range(50)])
    ids = {i.id for i in infos if isinstance(i, TaskInfo)}
    assert len(ids) == 50
    assert all(uuid.UUID(i).version == 4 for i in ids)


def test_far_future_process_in() -> None:
    with pytest.raises(ValueError, match="process_in is too far in the future"):
        compose(Task("t"), process_in=timedelta.max)


async def test_far_future_unique_schedule(client: Client, redis: Redis) -> None:
    at = datetime(9999, 12, 31, tzinfo=UTC)
    info = await client.enqueue(Task("t", b"far"), process_at=at, unique=timedelta(days=1))
    assert info.state is TaskState.SCHEDULED
    assert await redis.ttl(keys.unique_key("default", "t", b"far")) > 10**11
