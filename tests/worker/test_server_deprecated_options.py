"""The 21 old flat Server keywords: each still works for one release and warns, naming the
grouped option to give instead."""

from __future__ import annotations

import warnings
from dataclasses import fields
from datetime import timedelta
from typing import Any

import pytest

from asyncq import Aggregation, Intervals, Limits, Server
from asyncq._worker.config import GROUPED_OPTION_NAMES

NOWHERE = "redis://127.0.0.1:1/0"  # never connected: these tests build servers only

# Each flat keyword: a value other than its default, and the grouped option it becomes.
FLAT: dict[str, tuple[Any, str]] = {
    "task_check_interval": (timedelta(milliseconds=50), "intervals=asyncq.Intervals(task_check="),
    "delayed_task_check_interval": (
        timedelta(seconds=3),
        "intervals=asyncq.Intervals(delayed_task_check=",
    ),
    "heartbeat_interval": (timedelta(seconds=2), "intervals=asyncq.Intervals(heartbeat="),
    "recoverer_interval": (timedelta(seconds=30), "intervals=asyncq.Intervals(recoverer="),
    "recoverer_cutoff": (timedelta(seconds=1), "intervals=asyncq.Intervals(recoverer_cutoff="),
    "janitor_interval": (timedelta(seconds=4), "intervals=asyncq.Intervals(janitor="),
    "health_check_interval": (timedelta(seconds=7), "intervals=asyncq.Intervals(health_check="),
    "queue_refresh_interval": (
        timedelta(seconds=2),
        "intervals=asyncq.Intervals(queue_refresh=",
    ),
    "queue_concurrency": ({"q": 2}, "limits=asyncq.Limits(queue_concurrency="),
    "local_queue_concurrency": ({"q": 1}, "limits=asyncq.Limits(local_queue_concurrency="),
    "rate_limits": ({"q": "5/s"}, "limits=asyncq.Limits(rate_limits="),
    "type_rate_limits": ({"t": "5/s"}, "limits=asyncq.Limits(type_rate_limits="),
    "ordered_queues": (("q",), "limits=asyncq.Limits(ordered_queues="),
    "max_inflight_bytes": (1024, "limits=asyncq.Limits(max_inflight_bytes="),
    "sync_concurrency": (3, "limits=asyncq.Limits(sync_concurrency="),
    "janitor_batch_size": (50, "limits=asyncq.Limits(janitor_batch_size="),
    "group_aggregator": (
        lambda group, tasks: tasks[0],
        "aggregation=asyncq.Aggregation(aggregator=",
    ),
    "group_grace_period": (timedelta(seconds=3), "aggregation=asyncq.Aggregation(grace_period="),
    "group_max_delay": (timedelta(seconds=9), "aggregation=asyncq.Aggregation(max_delay="),
    "group_max_size": (5, "aggregation=asyncq.Aggregation(max_size="),
    "group_check_interval": (
        timedelta(seconds=2),
        "aggregation=asyncq.Aggregation(check_interval=",
    ),
}

_GROUP_OF = {"intervals": Intervals, "limits": Limits, "aggregation": Aggregation}


def test_the_table_covers_the_21_flat_names() -> None:
    assert set(FLAT) == GROUPED_OPTION_NAMES
    assert len(FLAT) == 21


@pytest.mark.parametrize("name", sorted(FLAT))
async def test_each_flat_name_warns_and_still_works(name: str) -> None:
    value, replacement = FLAT[name]
    with pytest.warns(DeprecationWarning) as caught:
        server = Server(NOWHERE, **{name: value})
    try:
        [warning] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        message = str(warning.message)
        assert f"Server({name}=...) is deprecated" in message
        assert "0.3.0" in message and replacement in message
        assert warning.filename == __file__  # it points at the Server(...) call
        # It still works: the config is the one the grouped option gives.
        keyword, _, rest = replacement.partition("=asyncq.")
        attr = rest.partition("(")[2].rstrip("=")
        group = _GROUP_OF[keyword]
        assert attr in {f.name for f in fields(group)}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the grouped form warns about nothing
            grouped = Server(NOWHERE, **{keyword: group(**{attr: value})})
        try:
            assert server.config == grouped.config
        finally:
            await grouped.shutdown()
    finally:
        await server.shutdown()


async def test_grouped_and_common_options_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        server = Server(
            NOWHERE,
            concurrency=2,
            queues={"a": 1},
            intervals=Intervals(heartbeat=timedelta(seconds=2)),
            limits=Limits(rate_limits={"a": "1/s"}),
            aggregation=Aggregation(grace_period=timedelta(seconds=2)),
        )
    await server.shutdown()
