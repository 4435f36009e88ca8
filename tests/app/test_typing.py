"""mypy checks the typed API: arguments and return types of typed tasks (ParamSpec/TypeVar)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

EXAMPLE = Path(__file__).resolve().parent / "typing" / "typed_usage.py"

pytestmark = pytest.mark.xdist_group("mypy")


def test_mypy_reports_exactly_the_marked_errors(tmp_path: Path) -> None:
    expected: set[tuple[int, str]] = set()
    for number, line in enumerate(EXAMPLE.read_text().splitlines(), start=1):
        marker = re.search(r"# E: ([a-z-]+)$", line)
        if marker:
            expected.add((number, marker.group(1)))
    assert len(expected) == 22  # the markers were read
    stdout, stderr, _ = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir", str(tmp_path / "cache"),
            "--show-error-codes",
            "--no-error-summary",
            "--hide-error-context",
            str(EXAMPLE),
        ]
    )  # fmt: skip
    assert not stderr, stderr
    found: set[tuple[int, str]] = set()
    for line in stdout.splitlines():
        if ": note: " in line:
            continue
        match = re.match(r".*typed_usage\.py:(\d+): error: .*\[([a-z-]+)\]$", line)
        assert match, f"unexpected mypy output: {line}"
        found.add((int(match.group(1)), match.group(2)))
    assert found == expected, stdout
