"""The command-line options (``option=value``) the crash-test worker scripts share:
``worker.py`` and ``workflow_worker.py`` read them alike."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

_DURATIONS = {  # option: (the group it goes in, the Server keyword or the Intervals field)
    "shutdown_timeout": ("server", "shutdown_timeout"),
    "lease": ("server", "lease_duration"),
    "heartbeat": ("intervals", "heartbeat"),
    "recoverer_interval": ("intervals", "recoverer"),
    "recoverer_cutoff": ("intervals", "recoverer_cutoff"),
    "task_check": ("intervals", "task_check"),
    "delayed_check": ("intervals", "delayed_task_check"),
}


def seconds(value: str) -> timedelta:
    return timedelta(seconds=float(value))


def server_options(
    raw: dict[str, str],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """*raw*'s shared options as ``(Server keywords, Intervals fields, the rest)``: the
    durations (seconds as floats) and ``concurrency``; the script reads the rest."""
    groups: dict[str, dict[str, Any]] = {"server": {}, "intervals": {}}
    rest: dict[str, str] = {}
    for key, value in raw.items():
        if key in _DURATIONS:
            group, name = _DURATIONS[key]
            groups[group][name] = seconds(value)
        elif key == "concurrency":
            groups["server"]["concurrency"] = int(value)
        else:
            rest[key] = value
    return groups["server"], groups["intervals"], rest
