"""The Server's settings: each bad value is refused naming the option as the user wrote it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from asyncq import Aggregation, Intervals, Limits, ServeMux, Server
from asyncq._worker.config import (
    DEFAULT_METRICS_HISTORY,
    GROUPED_OPTION_NAMES,
    build_config,
)
from asyncq._worker.groups import _GROUPS
from asyncq._worker.processor import Processor

NOWHERE = "redis://127.0.0.1:1/0"  # never connected: these tests build servers only

BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"concurrency": 0}, ValueError, "concurrency must be at least 1"),
    ({"concurrency": "4"}, TypeError, "concurrency must be an int"),
    ({"queues": {}}, ValueError, "queues cannot be empty"),
    ({"queues": {"q": 0}}, ValueError, "queue 'q' needs an integer priority"),
    ({"queues": ["q"]}, TypeError, "queues must be a mapping"),
    ({"retry_delay": 3}, TypeError, "retry_delay must be callable"),
    ({"error_handler": "x"}, TypeError, "error_handler must be callable"),
    ({"shutdown_timeout": 8}, TypeError, "shutdown_timeout must be a datetime.timedelta"),
    ({"shutdown_timeout": timedelta(0)}, ValueError, "shutdown_timeout must be positive"),
    ({"lease_duration": timedelta(seconds=1)}, ValueError, "lease_duration must be at least"),
    (
        {"lease_duration": timedelta(seconds=5), "heartbeat_interval": timedelta(seconds=5)},
        ValueError,
        r"lease_duration \(0:00:05\) must be longer than heartbeat_interval",
    ),
    (
        {"lease_duration": timedelta(seconds=5), "intervals": Intervals(heartbeat=timedelta(9))},
        ValueError,
        "must be longer than intervals.heartbeat",
    ),
    ({"heartbeat_interval": 5}, TypeError, "heartbeat_interval must be a datetime.timedelta"),
    (
        {"intervals": Intervals(heartbeat=timedelta(0))},
        ValueError,
        "intervals.heartbeat must be positive",
    ),
    ({"task_check_interval": timedelta(-1)}, ValueError, "task_check_interval must be positive"),
    (
        {"intervals": Intervals(task_check=timedelta(-1))},
        ValueError,
        "intervals.task_check must be positive",
    ),
    ({"recoverer_cutoff": timedelta(-1)}, ValueError, "recoverer_cutoff cannot be negative"),
    (
        {"intervals": Intervals(recoverer_cutoff=2)},  # type: ignore[arg-type]
        TypeError,
        "intervals.recoverer_cutoff must be a datetime.timedelta",
    ),
    ({"janitor_batch_size": 0}, ValueError, "janitor_batch_size must be at least 1"),
    ({"limits": Limits(janitor_batch_size=0)}, ValueError, "limits.janitor_batch_size must be"),
    ({"max_inflight_bytes": -1}, ValueError, "max_inflight_bytes must be at least 1"),
    ({"limits": Limits(sync_concurrency=0)}, ValueError, "limits.sync_concurrency must be"),
    ({"rate_limits": {"q": "fast"}}, ValueError, "rate_limits"),
    ({"limits": Limits(rate_limits={"q": "fast"})}, ValueError, "limits.rate_limits"),
    ({"limits": Limits(queue_concurrency={"q": -1})}, ValueError, "limits.queue_concurrency"),
    ({"group_grace_period": timedelta(0)}, ValueError, "group_grace_period must be at least"),
    (
        {"aggregation": Aggregation(grace_period=timedelta(milliseconds=10))},
        ValueError,
        "aggregation.grace_period must be at least 0:00:01",
    ),
    ({"group_max_size": -2}, ValueError, "group_max_size must be at least 1"),
    ({"aggregation": Aggregation(aggregator=1)}, TypeError, "aggregation.aggregator must be"),  # type: ignore[arg-type]
    ({"group_aggregator": 1}, TypeError, "group_aggregator must be callable"),
    ({"intervals": {"heartbeat": 1}}, TypeError, "intervals must be an asyncq.Intervals"),
    ({"limits": Intervals()}, TypeError, "limits must be an asyncq.Limits"),
    ({"heartbeat_intervall": timedelta(1)}, TypeError, "unexpected keyword argument"),
    (
        {
            "heartbeat_interval": timedelta(seconds=3),
            "intervals": Intervals(heartbeat=timedelta(4)),
        },
        ValueError,
        "heartbeat_interval and intervals.heartbeat are both given",
    ),
    ({"min_replicas": -1}, ValueError, "min_replicas cannot be negative"),
    ({"lifespan": 3}, TypeError, "lifespan must be callable"),
    ({"metrics_history": None}, TypeError, "metrics_history must be True, False or a datetime"),
    ({"metrics_history": 3600}, TypeError, "metrics_history must be True, False or a datetime"),
    ({"metrics_history": timedelta(seconds=59)}, ValueError, "metrics_history must be at least"),
    ({"events": "default"}, TypeError, "events must be True, False or a list of queue names"),
    ({"events": 1}, TypeError, "events must be True, False or a list of queue names"),
    ({"events": ["ok", " "]}, ValueError, "events queue names must be non-blank strings"),
]


@pytest.mark.parametrize(("options", "error", "message"), BAD)
def test_a_bad_value_names_its_option(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Server(NOWHERE, **options)


def test_history_and_events_are_settings_like_the_others() -> None:
    """Checked by build_config, as every other setting, and carried by the config."""
    assert build_config().metrics_history == (
        timedelta(hours=24) if DEFAULT_METRICS_HISTORY else None
    )
    assert build_config(metrics_history=True).metrics_history == timedelta(hours=24)
    assert build_config(metrics_history=False).metrics_history is None
    assert build_config(metrics_history=timedelta(hours=2)).metrics_history == timedelta(hours=2)
    assert build_config().events is False
    assert build_config(events=True).events is True
    assert build_config(events=["mail", "tenant:*"]).events == ("mail", "tenant:*")
    with pytest.raises(ValueError, match="metrics_history must be at least 1 minute"):
        build_config(metrics_history=timedelta(0))
    with pytest.raises(ValueError, match="events queue names"):
        build_config(events=[""])


def test_a_group_and_the_flat_keywords_give_the_same_config() -> None:
    flat = build_config(
        heartbeat_interval=timedelta(seconds=2),
        recoverer_cutoff=timedelta(0),
        rate_limits={"q": "5/s"},
        group_grace_period=timedelta(seconds=3),
    )
    grouped = build_config(
        intervals=Intervals(heartbeat=timedelta(seconds=2), recoverer_cutoff=timedelta(0)),
        limits=Limits(rate_limits={"q": "5/s"}),
        aggregation=Aggregation(grace_period=timedelta(seconds=3)),
    )
    assert flat == grouped
    assert grouped.heartbeat_interval == 2.0 and grouped.recoverer_cutoff == 0.0
    assert grouped.group_grace_period == 3.0 and grouped.group_check_interval == 3.0


def test_the_defaults_are_asynqs() -> None:
    cfg = build_config()
    assert dict(cfg.queues) == {"default": 1}
    assert cfg.heartbeat_interval == 5.0 and cfg.lease_duration == 30.0
    assert cfg.task_check_interval == 0.08 and cfg.syncer_interval == 5.0
    assert cfg.retry_delay is None and cfg.is_failure is None
    assert cfg.sync_concurrency == cfg.concurrency


def test_flat_and_group_may_set_different_fields() -> None:
    cfg = build_config(
        intervals=Intervals(janitor=timedelta(seconds=4)),
        heartbeat_interval=timedelta(seconds=2),
    )
    assert cfg.janitor_interval == 4.0 and cfg.heartbeat_interval == 2.0


def test_the_syncer_interval_is_not_a_server_option() -> None:
    with pytest.raises(TypeError, match="syncer_interval"):
        Server(NOWHERE, syncer_interval=timedelta(seconds=1))  # type: ignore[call-arg]


async def test_the_roles_exist_before_start() -> None:
    server = Server(NOWHERE, queues={"a": 1, "t:*": 1}, group_aggregator=lambda g, ts: ts[0])
    assert isinstance(server.processor, Processor)
    names = [role.name for role in server.roles]
    assert "processor" in names and "syncer" in names
    assert "queuewatcher" in names and "aggregator" in names and "healthchecker" not in names
    assert server.state == "new"
    server.stop()  # before start: nothing to stop
    assert server.state == "new"
    await server.shutdown()
    assert server.state == "closed"


async def test_the_processor_runs_no_handler_before_start() -> None:
    server = Server(NOWHERE)
    with pytest.raises(RuntimeError, match="before start"):
        await server.processor.handler(None)  # type: ignore[arg-type]
    await server.shutdown()
    with pytest.raises(Exception, match="closed"):
        await asyncio.wait_for(server.start(ServeMux()), 5)


def test_every_flat_keyword_of_a_group_is_typed_and_mapped() -> None:
    assert frozenset(_GROUPS) == GROUPED_OPTION_NAMES
