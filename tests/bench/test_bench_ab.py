"""The A/B guard (``python -m benchmarks.ab``) end to end at tiny N; no timing is asserted.

HEAD against this working tree: both revisions are installed (a git worktree of HEAD,
a snapshot of the tree), each into its own virtualenv pinned to this environment's
package versions, and measured in one round of ``--quick``. The checks are the shape of
what it prints and stores: every metric with A, B and B/A, every physical row whose
tool is present, the raw figures per round, and no asyncq task lost or run twice.
Skipped, with the reason, without git, uv or a git checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from benchmarks import ab, runner

pytestmark = [pytest.mark.bench, pytest.mark.xdist_group("bench_ab")]

AB_DB = 12  # the tool flushes its database; away from other tests' db 0 and bench_quick's 13


def _skip_reason() -> str | None:
    for tool in ("git", "uv"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    if not (runner.ROOT / ".git").exists():
        return f"{runner.ROOT} is not a git checkout: no HEAD to install"
    return None


@pytest.fixture(scope="session")
def ab_run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if (why := _skip_reason()) is not None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("ab") / "ab.json"
    url = urlsplit(redis_url)._replace(path=f"/{AB_DB}").geturl()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.ab", "HEAD", str(runner.ROOT), "--quick",
         "--runs", "1", "--redis-url", url, "--json", str(out)],
        cwd=runner.ROOT, capture_output=True, text=True, timeout=600, check=False,
        env=dict(os.environ, PYTHONPATH=str(runner.ROOT)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"stdout": proc.stdout, "doc": json.loads(out.read_text())}


def _rows(text: str) -> dict[str, list[str]]:
    """The markdown table rows of *text*, by their first cell (stripped)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.setdefault(cells[0], cells[1:])
    return rows


def test_every_metric_has_a_b_and_ratio(ab_run: dict[str, Any]) -> None:
    table = ab_run["doc"]["table"]
    assert "| metric | A: HEAD (" in table and "(working tree, " in table
    rows = _rows(table)
    for metric in ab.METRICS:
        cells = rows[metric.label.strip()]
        assert len(cells) == 4, (metric.label, cells)
        a, b, ratio, better = cells
        assert a != "–" and b != "–", metric.label
        assert ratio.endswith("×"), (metric.label, ratio)
        assert better == metric.better
    assert table in ab_run["stdout"]


def test_physical_rows_in_every_round(ab_run: dict[str, Any]) -> None:
    doc = ab_run["doc"]
    (physical,) = (rnd["physical"] for rnd in doc["rounds"])
    assert physical["redispy_set"]["tasks_per_s"] > 0
    assert physical["redispy_set"]["floor_cpu_us_per_call"] > 0
    expected = {"redispy_set"}
    if shutil.which("redis-benchmark"):
        expected |= {"set_c1", "set_c32", "hop"}
    assert expected <= physical.keys()
    rows = _rows(doc["table"])
    for metric in ab.PHYSICAL:
        if metric.get(physical) is not None:
            assert rows[metric.label][0] != "–", metric.label


def test_raw_figures_and_records(ab_run: dict[str, Any]) -> None:
    doc = ab_run["doc"]
    raw = _rows(doc["raw"])
    assert raw["metric"] == ["A1", "B1"]
    for metric in ab.METRICS:
        assert len(raw[metric.label.strip()]) == 2
    assert doc["failures"] == []
    assert doc["dependency_differences"] == []
    assert doc["revisions"]["A"]["commit"] and doc["revisions"]["B"]["path"]
    (rnd,) = doc["rounds"]
    for side in ab.SIDES:
        records = rnd[side]["records"]
        assert set(runner.PHASES) <= records.keys()
        assert records["process"]["lost"] == 0
        assert records["process"]["handler_calls_minus_n"] == 0


def test_ratios_are_taken_within_each_round() -> None:
    """B/A is each round's B over the same round's A: min–max over those ratios."""

    def run(rate: float) -> dict[str, Any]:
        return {"error": None, "records": {"process": {"tasks_per_s": rate}}}

    rounds = [
        {"physical": {}, "A": run(100.0), "B": run(150.0)},
        {"physical": {}, "A": run(200.0), "B": run(220.0)},
        {"physical": {}, "A": run(50.0), "B": {"error": "exited with code 1", "records": {}}},
    ]
    summary = ab.summarize(rounds)
    row = summary["process, 1 worker, conc. 100, tasks/s"]
    assert row["A"] == [100.0, 200.0, 50.0]
    assert row["B"] == [150.0, 220.0, None]
    assert row["B/A"] == [1.5, pytest.approx(1.1), None]


def test_raw_figures_follow_the_order_measured() -> None:
    """With --order abba the second round's B comes first in the raw table."""

    def run(rate: float) -> dict[str, Any]:
        return {"error": None, "records": {"process": {"tasks_per_s": rate}}}

    rounds = [
        {"physical": {}, "order": ["A", "B"], "A": run(100.0), "B": run(150.0)},
        {"physical": {}, "order": ["B", "A"], "A": run(200.0), "B": run(220.0)},
    ]
    raw = _rows(ab.render_raw(ab.summarize(rounds), [r["order"] for r in rounds]))
    assert raw["metric"] == ["A1", "B1", "B2", "A2"]
    assert raw["process, 1 worker, conc. 100, tasks/s"] == ["100", "150", "220", "200"]


def test_a_side_variant_is_named_and_passed_on() -> None:
    """--variant-b names B's variant in its label and passes it to B's runs only."""
    args = ab.parse_args(["HEAD", "HEAD", "--quick", "--variant-b", "no-history"])
    a = ab.Revision("HEAD", "0123456789abcdef", "0123456", None)
    b = ab.Revision("HEAD", "0123456789abcdef", "0123456", None, variant=args.variant_b)
    assert a.label == "HEAD (0123456)"
    assert b.label == "HEAD (0123456) [no-history]"
    assert "--variant" not in ab._passthrough(args, a)
    assert ab._passthrough(args, b)[-2:] == ["--variant", "no-history"]
