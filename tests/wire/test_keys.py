"""Every key name, spelled exactly as asynq v0.26 spells it (spec section 2)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from asyncq import _keys as keys

D = datetime(2024, 3, 9, 12, 0, tzinfo=UTC)

PER_QUEUE: list[tuple[Callable[[], str], str]] = [
    (lambda: keys.queue_key_prefix("default"), "asynq:{default}:"),
    (lambda: keys.task_key_prefix("default"), "asynq:{default}:t:"),
    (lambda: keys.task_key("default", "abc-123"), "asynq:{default}:t:abc-123"),
    (lambda: keys.pending_key("default"), "asynq:{default}:pending"),
    (lambda: keys.active_key("default"), "asynq:{default}:active"),
    (lambda: keys.scheduled_key("default"), "asynq:{default}:scheduled"),
    (lambda: keys.retry_key("default"), "asynq:{default}:retry"),
    (lambda: keys.archived_key("default"), "asynq:{default}:archived"),
    (lambda: keys.lease_key("default"), "asynq:{default}:lease"),
    (lambda: keys.completed_key("default"), "asynq:{default}:completed"),
    (lambda: keys.paused_key("default"), "asynq:{default}:paused"),
    (lambda: keys.processed_total_key("default"), "asynq:{default}:processed"),
    (lambda: keys.failed_total_key("default"), "asynq:{default}:failed"),
    (lambda: keys.processed_key("default", D), "asynq:{default}:processed:2024-03-09"),
    (lambda: keys.failed_key("default", D), "asynq:{default}:failed:2024-03-09"),
    (lambda: keys.all_groups("default"), "asynq:{default}:groups"),
    (
        lambda: keys.metrics_history_key("default", 29_000_000),
        "asynq:{default}:asyncq:metrics:29000000",
    ),
    (lambda: keys.progress_key("default", "t1"), "asyncq:{default}:progress:t1"),
    (lambda: keys.progress_channel("default"), "asyncq:progress:{default}"),
    (lambda: keys.group_key_prefix("default"), "asynq:{default}:g:"),
    (lambda: keys.group_key("default", "mygroup"), "asynq:{default}:g:mygroup"),
    (
        lambda: keys.aggregation_set_key("default", "mygroup", "set-1"),
        "asynq:{default}:g:mygroup:set-1",
    ),
    (lambda: keys.all_aggregation_sets("default"), "asynq:{default}:aggregation_sets"),
    (lambda: keys.wakeup_channel("default"), "asyncq:wakeup:{default}"),
    (lambda: keys.run_key("default", "r1"), "asynq:{default}:asyncq:run:r1"),
    (lambda: keys.signal_key("default", "opened", "42"), "asynq:{default}:asyncq:signal:opened:42"),
    (
        lambda: keys.awaiting_key("default", "opened", "42"),
        "asynq:{default}:asyncq:awaiting:opened:42",
    ),
    (
        lambda: keys.scheduler_claim_key("3f2a", 1_700_000_000),
        "asyncq:scheduler_claims:{3f2a}:1700000000",
    ),
    (lambda: keys.scheduler_lister_key("3f2a"), "asyncq:scheduler_lister:{3f2a}"),
]

GLOBAL: list[tuple[Callable[[], str], str]] = [
    (lambda: keys.ALL_SERVERS, "asynq:servers"),
    (lambda: keys.ALL_WORKERS, "asynq:workers"),
    (lambda: keys.ALL_SCHEDULERS, "asynq:schedulers"),
    (lambda: keys.ALL_QUEUES, "asynq:queues"),
    (lambda: keys.CANCEL_CHANNEL, "asynq:cancel"),
    (lambda: keys.server_info_key("host", 42, "sid"), "asynq:servers:{host:42:sid}"),
    (lambda: keys.workers_key("host", 42, "sid"), "asynq:workers:{host:42:sid}"),
    # asyncq-only, in the same slot as the two above.
    (
        lambda: keys.server_type_rates_key("host", 42, "sid"),
        "asyncq:server_type_rates:{host:42:sid}",
    ),
    (
        lambda: keys.server_queue_flow_key("host", 42, "sid"),
        "asyncq:server_queue_flow:{host:42:sid}",
    ),
    (lambda: keys.scheduler_entries_key("h:1:uuid"), "asynq:schedulers:{h:1:uuid}"),
    (lambda: keys.EVENTS_KEY, "asyncq:events"),
    # asyncq-only: the mark before a task ID on asynq:cancel that stops it for good.
    (lambda: keys.STOP_MARK, "{asyncq:stop}"),
    (lambda: keys.scheduler_history_key("entry-1"), "asynq:scheduler_history:entry-1"),
]


@pytest.mark.parametrize(("build", "expected"), PER_QUEUE + GLOBAL)
def test_key_names(build: Callable[[], str], expected: str) -> None:
    assert build() == expected


def test_every_exported_builder_is_covered() -> None:
    covered = {
        "ALL_QUEUES",
        "ALL_SCHEDULERS",
        "ALL_SERVERS",
        "ALL_WORKERS",
        "CANCEL_CHANNEL",
        "EVENTS_KEY",
        "STOP_MARK",
        "active_key",
        "aggregation_set_key",
        "all_aggregation_sets",
        "awaiting_key",
        "all_groups",
        "archived_key",
        "completed_key",
        "expected_type",
        "failed_key",
        "failed_total_key",
        "group_key",
        "group_key_prefix",
        "lease_key",
        "metrics_history_key",
        "paused_key",
        "pending_key",
        "processed_key",
        "processed_total_key",
        "progress_channel",
        "progress_key",
        "queue_key_prefix",
        "refuse_braces",
        "retry_key",
        "run_key",
        "scheduled_key",
        "scheduler_claim_key",
        "scheduler_entries_key",
        "scheduler_history_key",
        "scheduler_lister_key",
        "server_info_key",
        "server_queue_flow_key",
        "server_type_rates_key",
        "signal_key",
        "task_key",
        "task_key_prefix",
        "unique_key",
        "validate_queue_name",
        "wakeup_channel",
        "workers_key",
    }
    assert set(keys.__all__) == covered


def test_every_asynq_key_has_its_expected_type() -> None:
    """The type named when Redis answers WRONGTYPE (asyncq._redis.scripts)."""
    day = D
    cases = {
        keys.task_key("q", "a:b"): "hash",
        keys.pending_key("q"): "list",
        keys.active_key("q"): "list",
        keys.scheduled_key("q"): "zset",
        keys.retry_key("q"): "zset",
        keys.archived_key("q"): "zset",
        keys.completed_key("q"): "zset",
        keys.lease_key("q"): "zset",
        keys.paused_key("q"): "string",
        keys.limit_key("q"): "string",
        keys.ordered_key("q"): "string",
        keys.rate_key("q"): "hash",
        keys.metrics_history_key("q", 29_000_000): "hash",
        keys.run_key("q", "r1"): "hash",
        keys.signal_key("q", "opened", "42"): "string",
        keys.awaiting_key("q", "opened", "42"): "set",
        keys.processed_key("q", day): "string",
        keys.failed_key("q", day): "string",
        keys.processed_total_key("q"): "string",
        keys.failed_total_key("q"): "string",
        keys.unique_key("q", "t", b"p"): "string",
        keys.all_groups("q"): "set",
        keys.group_key("q", "g:1"): "zset",
        keys.aggregation_set_key("q", "g", "s"): "zset",
        keys.all_aggregation_sets("q"): "zset",
        keys.ALL_QUEUES: "set",
        keys.ALL_SERVERS: "zset",
        keys.ALL_WORKERS: "zset",
        keys.ALL_SCHEDULERS: "zset",
        keys.server_info_key("h", 1, "s"): "string",
        keys.workers_key("h", 1, "s"): "hash",
        keys.scheduler_entries_key("s"): "list",
        keys.scheduler_history_key("e"): "zset",
    }
    assert {k: keys.expected_type(k) for k in cases} == cases
    assert keys.expected_type("unrelated") is None
    assert keys.expected_type("asynq:{q}:t:") is None
    # A prefix with nothing after it names no key: no group, no unique lock.
    assert keys.expected_type("asynq:{q}:g:") is None
    assert keys.expected_type("asynq:{q}:unique:") is None
    # Go asynq accepts braces in task IDs: its key is still the task's hash, read from the
    # first "}:" (the queue's), not from one inside the ID.
    assert keys.expected_type("asynq:{q}:t:a}:pending") == "hash"


def test_unique_key_nil_and_empty_payloads_differ() -> None:
    assert keys.unique_key("default", "reindex", None) == "asynq:{default}:unique:reindex:"
    assert (
        keys.unique_key("default", "reindex", b"")
        == "asynq:{default}:unique:reindex:d41d8cd98f00b204e9800998ecf8427e"
    )
    # md5("hello") hex digest.
    assert (
        keys.unique_key("q", "email:send", b"hello")
        == "asynq:{q}:unique:email:send:5d41402abc4b2a76b9719d911017c592"
    )


def test_daily_keys_use_the_utc_date() -> None:
    # 20:00 on Jan 1 at UTC-8 is 04:00 on Jan 2 in UTC.
    west = datetime(2024, 1, 1, 20, 0, tzinfo=timezone(timedelta(hours=-8)))
    assert keys.processed_key("default", west) == "asynq:{default}:processed:2024-01-02"
    assert keys.failed_key("default", west) == "asynq:{default}:failed:2024-01-02"
    # 01:00 on Mar 1 at UTC+9 is still Feb 29 (leap year) in UTC.
    east = datetime(2024, 3, 1, 1, 0, tzinfo=timezone(timedelta(hours=9)))
    assert keys.processed_key("q", east) == "asynq:{q}:processed:2024-02-29"


def test_daily_keys_reject_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="aware"):
        keys.processed_key("default", datetime(2024, 1, 1))


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_blank_queue_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="queue name"):
        keys.validate_queue_name(name)


def test_queue_names_may_hold_colons_but_not_braces() -> None:
    keys.validate_queue_name("reports:eu:d")
    assert keys.pending_key("reports:eu") == "asynq:{reports:eu}:pending"
    # A brace would let two names share a key (or leave the queue's cluster slot).
    with pytest.raises(ValueError, match=r"^queue name 'a\{b\}c:d' holds .* braces"):
        keys.validate_queue_name("a{b}c:d")
    for one_brace in ("a{b", "b}c", "{", "}"):  # one alone is enough to break the schema
        with pytest.raises(ValueError, match="braces"):
            keys.validate_queue_name(one_brace)
