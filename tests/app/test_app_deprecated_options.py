"""The App's worker settings are grouped like the Server's: its Server gets grouped options
only, a flat name given to the App warns at the user's call, and a per-call override
merges a group field by field."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from click.testing import CliRunner

import asyncq.app as app_module
from asyncq import Aggregation, App, Intervals, Limits
from asyncq._worker.config import GROUP_KEYWORDS, GROUPED_OPTION_NAMES
from asyncq.cli import main

NOWHERE = "redis://127.0.0.1:1/0"  # never connected: these tests build servers only
SECOND = timedelta(seconds=1)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The options of every Server the App makes (none is made)."""
    seen: list[dict[str, Any]] = []

    class Recording:
        def __init__(self, redis: Any, **options: Any) -> None:
            seen.append(options)
            self.config = type("Config", (), {"queues": options["queues"]})()

    monkeypatch.setattr(app_module, "Server", Recording)
    return seen


def _deprecations(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, DeprecationWarning)]


async def test_grouped_app_settings_warn_about_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = App(
            NOWHERE,
            concurrency=2,
            queues={"a": 1},
            intervals=Intervals(heartbeat=2 * SECOND),
            limits=Limits(rate_limits={"a": "1/s"}),
            aggregation=Aggregation(grace_period=2 * SECOND),
        )
        app.worker_settings(limits=Limits(queue_concurrency={"a": 1}))
        server = app.server(intervals=Intervals(recoverer=30 * SECOND), burst=True)
        app.run_worker(burst=True).close()  # read its options, never run
    await server.shutdown()
    assert _deprecations(caught) == []
    assert server.config.heartbeat_interval == 2.0 and server.config.recoverer_interval == 30.0


def test_the_server_gets_grouped_options_only(recorded: list[dict[str, Any]]) -> None:
    with pytest.warns(DeprecationWarning):
        app = App(NOWHERE, heartbeat_interval=2 * SECOND, rate_limits={"a": "1/s"})
    assert not GROUPED_OPTION_NAMES & set(app.worker_options)
    with pytest.warns(DeprecationWarning):
        app.server(group_max_size=5)
    (options,) = recorded
    assert not GROUPED_OPTION_NAMES & set(options)
    assert options["intervals"] == Intervals(heartbeat=2 * SECOND)
    assert options["limits"] == Limits(rate_limits={"a": "1/s"})
    assert options["aggregation"] == Aggregation(max_size=5)


def _line_of(call: Callable[..., object]) -> int:
    return inspect.getsourcelines(call)[1]


# Each deprecated App path: what the warning says it was given to, and the call.
PATHS: dict[str, Callable[[App[None]], object]] = {
    "App": lambda app: App(NOWHERE, heartbeat_interval=2 * SECOND),
    "app.server": lambda app: app.server(heartbeat_interval=2 * SECOND),
    "app.run_worker": lambda app: app.run_worker(heartbeat_interval=2 * SECOND).close(),
    "worker_settings": lambda app: app.worker_settings(heartbeat_interval=2 * SECOND),
}


@pytest.mark.parametrize("where", sorted(PATHS))
def test_a_flat_name_given_to_the_app_warns_at_the_caller(
    where: str, recorded: list[dict[str, Any]]
) -> None:
    app: App[None] = App(NOWHERE)
    call = PATHS[where]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(app)
    [warning] = _deprecations(caught)
    message = str(warning.message)
    assert f"{where}(heartbeat_interval=...) is deprecated" in message
    assert "0.3.0" in message and "intervals=asyncq.Intervals(heartbeat=...)" in message
    assert (warning.filename, warning.lineno) == (__file__, _line_of(call))


def test_every_flat_name_given_to_the_app_is_its_group_field(
    recorded: list[dict[str, Any]],
) -> None:
    from asyncq._worker.groups import _GROUPS

    grouped = {
        "intervals": Intervals(heartbeat=2 * SECOND, janitor=3 * SECOND),
        "limits": Limits(rate_limits={"a": "1/s"}, janitor_batch_size=9),
        "aggregation": Aggregation(max_size=4, grace_period=9 * SECOND),
    }
    kw_of = {Intervals: "intervals", Limits: "limits", Aggregation: "aggregation"}
    flat = {
        name: getattr(grouped[kw_of[cls]], attr)
        for name, (attr, cls) in _GROUPS.items()
        if getattr(grouped[kw_of[cls]], attr) != getattr(cls(), attr)
    }
    assert len(flat) == 6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        App(NOWHERE, **flat).server()
        App(NOWHERE, **grouped).server()  # type: ignore[call-overload]
    assert len(_deprecations(caught)) == 6
    assert {w.filename for w in _deprecations(caught)} == {__file__}
    by_flat, by_group = recorded
    assert by_flat == by_group
    assert {k: by_flat[k] for k in GROUP_KEYWORDS} == grouped


def test_an_override_merges_a_group_field_by_field(recorded: list[dict[str, Any]]) -> None:
    app = App(NOWHERE, intervals=Intervals(heartbeat=2 * SECOND, janitor=3 * SECOND))
    # A field the override sets (to other than its default) replaces the App's; the
    # App's other fields stay.
    app.server(intervals=Intervals(recoverer=30 * SECOND, janitor=4 * SECOND))
    assert recorded[-1]["intervals"] == Intervals(
        heartbeat=2 * SECOND, janitor=4 * SECOND, recoverer=30 * SECOND
    )
    # A field left at its default keeps the App's value.
    app.server(intervals=Intervals(heartbeat=Intervals().heartbeat))
    assert recorded[-1]["intervals"].heartbeat == 2 * SECOND
    # A group the override does not give is the App's; one the App has not is the call's.
    app.server(limits=Limits(queue_concurrency={"a": 1}))
    assert recorded[-1]["intervals"] == Intervals(heartbeat=2 * SECOND, janitor=3 * SECOND)
    assert recorded[-1]["limits"] == Limits(queue_concurrency={"a": 1})
    assert "aggregation" not in recorded[-1]
    # worker_settings says the same as the Server gets.
    merged = app.worker_settings(intervals=Intervals(recoverer=30 * SECOND))
    assert merged.get("intervals") == Intervals(
        heartbeat=2 * SECOND, janitor=3 * SECOND, recoverer=30 * SECOND
    )


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_flat_name_and_a_group_field_resolve_the_same_way(
    recorded: list[dict[str, Any]],
) -> None:
    results = []
    two, thirty = {"heartbeat": 2 * SECOND}, {"recoverer": 30 * SECOND}
    for app_setting, override in [
        ({"heartbeat_interval": 2 * SECOND}, {"intervals": Intervals(recoverer=30 * SECOND)}),
        ({"intervals": Intervals(heartbeat=2 * SECOND)}, {"recoverer_interval": 30 * SECOND}),
        ({"heartbeat_interval": 2 * SECOND}, {"recoverer_interval": 30 * SECOND}),
        ({"intervals": Intervals(**two)}, {"intervals": Intervals(**thirty)}),
    ]:  # fmt: skip
        App(NOWHERE, **app_setting).server(**override)  # type: ignore[arg-type]
        results.append(recorded[-1]["intervals"])
    assert results == [Intervals(heartbeat=2 * SECOND, recoverer=30 * SECOND)] * 4
    # The same setting overridden: the call's value, whichever way either gave it.
    for app_setting, override in [
        ({"heartbeat_interval": 2 * SECOND}, {"intervals": Intervals(heartbeat=3 * SECOND)}),
        ({"intervals": Intervals(heartbeat=2 * SECOND)}, {"heartbeat_interval": 3 * SECOND}),
    ]:  # fmt: skip
        App(NOWHERE, **app_setting).server(**override)  # type: ignore[arg-type]
        assert recorded[-1]["intervals"] == Intervals(heartbeat=3 * SECOND)


def test_a_setting_given_both_ways_in_one_call_is_refused() -> None:
    both: dict[str, Any] = {
        "heartbeat_interval": 2 * SECOND,
        "intervals": Intervals(heartbeat=3 * SECOND),
    }
    with pytest.raises(ValueError, match=r"heartbeat_interval and intervals\.heartbeat"):
        App(NOWHERE, **both)
    with pytest.raises(ValueError, match=r"heartbeat_interval and intervals\.heartbeat"):
        App(NOWHERE).server(**both)
    with pytest.raises(TypeError, match=r"intervals must be an asyncq\.Intervals"):
        App(NOWHERE, intervals=Limits())  # type: ignore[call-overload]


MODULE = """
from datetime import timedelta
from asyncq import App, Intervals, Limits, ServeMux

mux = ServeMux()
app = App(
    concurrency=1,
    intervals=Intervals(heartbeat=timedelta(seconds=2)),
    limits=Limits(queue_concurrency={"default": 3}),
)
"""


def test_the_worker_command_warns_about_nothing(
    r: sync_redis.Redis,  # a flushed database: leftovers would keep the burst workers busy
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncq._worker.server

    configs = []

    class Recording(asyncq._worker.server.Server):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            configs.append(self.config)

    monkeypatch.setattr(asyncq._worker.server, "Server", Recording)
    monkeypatch.setattr(app_module, "Server", Recording)
    (tmp_path / "grouped_app.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    flags = ["--burst", "--lease-duration", "12s", "--recoverer-interval", "20s"]
    flags += ["--recoverer-cutoff", "500ms", "--rate-limit", "default=5/s"]
    flags += ["--local-queue-concurrency", "default=2"]
    runs = [["grouped_app:app"], ["grouped_app:app", "--heartbeat-interval", "3s"]]
    runs.append(["grouped_app:mux"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [
            CliRunner().invoke(main, ["-u", redis_url, "worker", *run, *flags]) for run in runs
        ]
    for result in results:
        assert result.exit_code == 0, result.output
    assert _deprecations(caught) == []
    app, app_heartbeat, mux = configs
    # The App's group fields stay unless a flag gives them.
    assert (app.heartbeat_interval, app_heartbeat.heartbeat_interval) == (2.0, 3.0)
    assert app.recoverer_interval == 20.0 and app.recoverer_cutoff == 0.5
    assert dict(app.queue_concurrency) == {"default": 3}
    for cfg in (app, mux):
        assert dict(cfg.local_queue_concurrency) == {"default": 2}
        assert set(cfg.rate_limits) == {"default"}
    assert mux.recoverer_interval == 20.0 and mux.heartbeat_interval == 5.0
