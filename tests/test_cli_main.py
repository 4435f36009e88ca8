"""``python -m asyncq.cli`` runs the same command group (in-process, so coverage sees it)."""

from __future__ import annotations

import runpy
import sys

import pytest


def test_module_entry_point_runs_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["asyncq", "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("asyncq.cli", run_name="__main__")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "Usage:" in out and "queue" in out and "task" in out
