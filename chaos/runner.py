"""Run the scenarios, print the figures table and write them as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from asyncq.devserver import ServerNotFoundError, find_server_binary
from chaos.harness import Figures
from chaos.scenarios import SCENARIOS, Size

__all__ = ["main", "markdown", "table"]

COLUMNS = (
    ("scenario", 30),
    ("tasks", 7),
    ("kills", 6),
    ("lost", 5),
    ("dups", 6),
    ("explained", 10),
    ("drain s", 8),
    ("total s", 8),
    ("ok", 4),
)


def table(figures: list[Figures]) -> str:
    head = " | ".join(name.ljust(width) for name, width in COLUMNS)
    lines = [head, "-" * len(head)]
    for f in figures:
        cells = (
            f.scenario,
            f.tasks,
            f.kills,
            f.lost,
            f.duplicates,
            f.explained,
            f"{f.drain_s:.1f}",
            f"{f.duration_s:.1f}",
            "yes" if f.ok else "NO",
        )
        lines.append(" | ".join(str(c).ljust(w) for c, (_, w) in zip(cells, COLUMNS, strict=True)))
    return "\n".join(lines)


def markdown(rows: list[dict[str, object]]) -> str:
    """The figures of a JSON result file as a Markdown table (for docs/guarantees.md)."""
    head = (
        "| scenario | tasks | kills | lost | duplicates | explained | time to drain (s) "
        "| total (s) | ok |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['tasks']:,} | {r['kills']} | {r['lost']} | "
            f"{r['duplicates']} | {r['explained_duplicates']} | {r['time_to_drain_s']} | "
            f"{r['duration_s']} | {'yes' if r['ok'] else 'NO'} |"
        )
    return "\n".join(lines)


async def _run(names: list[str], size: Size) -> list[Figures]:
    out = []
    for name in names:
        print(f"== {name} ...", flush=True)
        started = time.time()
        try:
            fig = await SCENARIOS[name](size)
        except Exception as exc:
            fig = Figures(name, error=f"{type(exc).__name__}: {exc}")
            fig.duration_s = time.time() - started
            traceback.print_exc()
        print(table([fig]).splitlines()[-1], flush=True)
        if fig.error:
            print(f"   error: {fig.error}", flush=True)
        out.append(fig)
    return out


def _redis_version() -> str:
    try:
        return subprocess.run(
            [str(find_server_binary().path), "--version"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError, ServerNotFoundError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="CI-sized durations and task counts")
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="run these only")
    parser.add_argument("--json", type=Path, default=Path("chaos-results.json"))
    parser.add_argument(
        "--markdown", type=Path, metavar="JSON", help="print a result file as a Markdown table"
    )
    args = parser.parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())["scenarios"]))
        return
    names = args.only or list(SCENARIOS)
    figures = asyncio.run(_run(names, Size(quick=args.quick)))
    print()
    print(table(figures))
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "python": platform.python_version(),
        "redis": _redis_version(),
        "scenarios": [f.as_dict() for f in figures],
    }
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nfigures written to {args.json}")
    # Last, so that a CI log cut in the middle still ends with what failed and why.
    for f in figures:
        if not f.ok:
            print(f"\n{f.scenario}: FAILED {f.error}\n  {json.dumps(f.as_dict()['notes'])}")
    sys.exit(0 if all(f.ok for f in figures) else 1)
