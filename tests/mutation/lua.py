"""Mutation testing of the broker's Lua scripts (``nox -s mutation -- lua``).

``python -m tests.mutation.lua [SCRIPT ...]`` runs it directly.

No common mutation tool reads Lua, so this one makes single-line mutants of each
script under ``asyncq/_broker/lua/`` itself:

* ``drop``: a write command (HSET, LPUSH, ZADD, DEL, INCR, ...) that is a statement
  of its own is removed;
* ``swap``: LPUSH <-> RPUSH, ZADD <-> ZREM, SADD <-> SREM, INCR -> DECR;
* ``cmp``: a comparison is changed (``==`` <-> ``~=``, ``<`` <-> ``<=``, ``>`` <-> ``>=``);
* ``num``: an integer constant moves by one (not ``KEYS[i]``/``ARGV[i]`` indices,
  unless ``--indices``: reading the wrong argument is a crash nearly every test sees);
* ``guard``: an ``if``/``elseif`` condition is replaced by ``false`` (the guarded
  block is skipped) and by ``true`` (it always runs);
* ``logic``: ``and`` <-> ``or``, ``not`` removed.

Every mutant of a script runs in one pytest process (``tests/mutation/runner.py``):
the tests that exercise the script (not the slow ones, hypothesis profile
``mutation``: the default examples without shrinking) run once on git's copy of the
script, then against each mutant, swapped into the loaded scripts, until the first
failure. The files on disk are never written: mutants come from git's HEAD, so
commit a script before mutating it, and runs of several scripts may go side by side.

The report (``--report``, Markdown) lists per script the mutants killed and survived,
then every survivor with its line, so each can be judged: a test to add,
or an equivalent mutant (its reason written beside it in the note).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.runner import SPEC, committed

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "asyncq" / "_broker" / "lua"

WRITES = frozenset(
    ("HSET", "HDEL", "HSETNX", "LPUSH", "RPUSH", "LREM", "LPOP", "RPOP", "RPOPLPUSH", "LMOVE",
     "ZADD", "ZREM", "ZREMRANGEBYRANK", "ZREMRANGEBYSCORE", "SADD", "SREM", "DEL", "UNLINK",
     "SET", "SETEX", "SETNX", "INCR", "INCRBY", "DECR", "EXPIRE", "EXPIREAT", "PEXPIRE",
     "PEXPIREAT", "PUBLISH")
)  # fmt: skip
SWAPS = {"LPUSH": "RPUSH", "RPUSH": "LPUSH", "ZADD": "ZREM", "ZREM": "ZADD", "SADD": "SREM",
         "SREM": "SADD", "INCR": "DECR"}  # fmt: skip
CMP = {"==": "~=", "~=": "==", "<": "<=", "<=": "<", ">": ">=", ">=": ">"}

# The state-transition scripts and the tests that exercise them: the broker's unit
# tests (Redis state before and after, key by key), the no-partial-write checks and
# the model of the state machine. Others fall back to DEFAULT_TESTS.
BROKER_TESTS = (
    "tests/test_broker.py",
    "tests/test_broker_processing.py",
    "tests/test_broker_batch.py",
    "tests/test_dequeue_edges.py",
    "tests/test_script_no_partial_write.py",
    "tests/test_model_state_machine.py",
    "tests/test_lua_boundaries.py",
)
INSPECTOR_TESTS = (
    "tests/test_inspector.py",
    "tests/test_inspector_broker.py",
    "tests/test_script_no_partial_write.py",
    "tests/test_model_state_machine.py",
    "tests/test_lua_boundaries.py",
)
MULTI_TESTS = (
    *BROKER_TESTS,
    "tests/test_many_queues.py",
    "tests/test_flow_control.py",
    "tests/test_hostile_multiqueue.py",
)
DEFAULT_TESTS = BROKER_TESTS
TESTS: dict[str, tuple[str, ...]] = {
    "dequeue_queues": MULTI_TESTS,
    "forward_queues": MULTI_TESTS,
    "list_lease_expired_queues": MULTI_TESTS,
    "delete_expired_completed_queues": MULTI_TESTS,
    "reclaim_stale_aggregation_sets_queues": MULTI_TESTS,
    "aggregation_check": (
        *BROKER_TESTS,
        "tests/test_broker_records.py",
        "tests/test_aggregator.py",
    ),
    "read_aggregation_set": (*BROKER_TESTS, "tests/test_broker_records.py"),
    "delete_aggregation_set": (*BROKER_TESTS, "tests/test_broker_records.py"),
}
STATE_TRANSITIONS = (
    "enqueue", "enqueue_unique", "enqueue_many", "schedule", "schedule_unique", "add_to_group",
    "add_to_group_unique", "dequeue_queues", "done", "mark_as_complete",
    "ack_many", "requeue", "retry", "archive", "forward_queues",
    "list_lease_expired_queues", "delete_expired_completed_queues", "aggregation_check",
    "reclaim_stale_aggregation_sets_queues", "delete_aggregation_set", "inspect_run_task",
    "inspect_delete_task", "inspect_archive_task",
)  # fmt: skip


def tests_for(script: str) -> tuple[str, ...]:
    if script.startswith("inspect_"):
        return INSPECTOR_TESTS
    if script.startswith("workflow_"):
        return ("tests/test_workflow.py",)
    return TESTS.get(script, DEFAULT_TESTS)


@dataclass(frozen=True)
class Mutant:
    script: str
    line: int  # 1-based
    kind: str
    description: str
    source: str  # the whole mutated script


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_CALL = re.compile(r'redis\.p?call\(\s*"([A-Z]+)"')
_CMP = re.compile(r"==|~=|<=|>=|<|>")
_NUM = re.compile(r"(?<![\w.])\d+(?![\w.])")
_INDEX = re.compile(r"(?:KEYS|ARGV)\[(\d+)\]")
_IF = re.compile(r"^(\s*)(if|elseif)\s+(.*?)\s+then\b(.*)$")
_WORD = re.compile(r"\b(and|or)\b|\bnot\s+")


def _code_span(line: str) -> tuple[str, list[tuple[int, int]]]:
    """The line without its ``--`` comment, and the spans of its string literals."""
    strings: list[tuple[int, int]] = []
    pos = 0
    while pos < len(line):
        m = _STRING.search(line, pos)
        comment = line.find("--", pos)
        if comment != -1 and (m is None or comment < m.start()):
            return line[:comment], strings
        if m is None:
            break
        strings.append(m.span())
        pos = m.end()
    return line, strings


def _outside(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    return all(end <= a or start >= b for a, b in spans)


def _balanced(code: str) -> bool:
    return code.count("(") == code.count(")")


def line_mutants(line: str, *, indices: bool = False) -> Iterator[tuple[str, str, str]]:
    """(kind, description, new line) for each single change to one line of Lua."""
    code, strings = _code_span(line)
    stripped = code.strip()
    if not stripped:
        return
    indent = line[: len(line) - len(line.lstrip())]
    for m in _CALL.finditer(code):
        cmd = m.group(1)
        start, end = m.span(1)
        if (
            cmd in WRITES
            and stripped.startswith(("redis.call(", "redis.pcall("))
            and (_balanced(code) and m.start() == len(indent))
        ):
            yield "drop", f"drop {cmd}", f"{indent}-- mutant: dropped {cmd}"
        if cmd in SWAPS:
            swapped = line[:start] + SWAPS[cmd] + line[end:]
            yield "swap", f"{cmd} -> {SWAPS[cmd]}", swapped
    for m in _CMP.finditer(code):
        if _outside(strings, *m.span()):
            op = m.group(0)
            yield "cmp", f"{op} -> {CMP[op]}", line[: m.start()] + CMP[op] + line[m.end() :]
    index_spans = [m.span(1) for m in _INDEX.finditer(code)]
    for m in _NUM.finditer(code):
        if not _outside(strings, *m.span()):
            continue
        if m.span() in index_spans and not indices:
            continue
        n = int(m.group(0))
        for new in (n + 1, n - 1):
            if new >= 0:
                yield "num", f"{n} -> {new}", line[: m.start()] + str(new) + line[m.end() :]
    m_if = _IF.match(code)
    if m_if and _outside(strings, m_if.start(3), m_if.end(3)):
        pre, word, _cond, rest = m_if.groups()
        for value in ("false", "true"):
            yield "guard", f"{word} {value}", f"{pre}{word} {value} then{rest}"
    for m in _WORD.finditer(code):
        if not _outside(strings, *m.span()):
            continue
        if m.group(1):
            new = "or" if m.group(1) == "and" else "and"
            yield "logic", f"{m.group(1)} -> {new}", line[: m.start()] + new + line[m.end() :]
        else:
            yield "logic", "drop not", line[: m.start()] + line[m.end() :]


def mutants(script: str, source: str, *, indices: bool = False) -> list[Mutant]:
    lines = source.split("\n")
    out: list[Mutant] = []
    for n, line in enumerate(lines):
        for kind, desc, new in line_mutants(line, indices=indices):
            if new == line:
                continue
            text = "\n".join([*lines[:n], new, *lines[n + 1 :]])
            out.append(Mutant(script, n + 1, kind, desc, text))
    return out


@dataclass
class Result:
    mutant: Mutant
    outcome: str  # killed, survived
    killer: str | None  # the test that failed first
    seconds: float


def mutate_script(
    script: str,
    results: list[Result],
    *,
    indices: bool,
    only: set[str] | None,
    lines: set[int] | None = None,
    log: bool = True,
) -> None:
    """Run every mutant of *script* in one pytest process (tests/mutation/runner.py),
    appending each outcome to *results* as it comes (so an interrupted run still reports
    what it finished)."""
    original = committed(script)
    todo = [
        m
        for m in mutants(script, original, indices=indices)
        if (not only or m.kind in only) and (not lines or m.line in lines)
    ]
    with tempfile.TemporaryDirectory(prefix="asyncq-mutation-") as tmp:
        spec = Path(tmp) / "spec.json"
        out = Path(tmp) / "results.jsonl"
        spec.write_text(
            json.dumps(
                {
                    "script": script,
                    "results": str(out),
                    "mutants": [{"source": m.source} for m in todo],
                }
            ),
            encoding="utf-8",
        )
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-p", "tests.mutation.runner", "-m", "not slow",
            "--timeout", "120", *tests_for(script),
        ]  # fmt: skip
        env = {**os.environ, SPEC: str(spec), "ASYNCQ_HYPOTHESIS_PROFILE": "mutation"}
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        seen = 0
        try:
            while True:
                done = proc.poll() is not None
                lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
                for line in lines[seen:]:
                    record = json.loads(line)
                    if record.get("baseline") == "failed":
                        raise SystemExit(
                            f"the tests for {script} fail on the unmutated script: {record['test']}"
                        )
                    if "index" not in record:
                        continue
                    if record["scripts"] == 0:
                        raise SystemExit(f"no loaded script holds {script}.lua")
                    mutant = todo[record["index"]]
                    result = Result(mutant, record["outcome"], record["killer"], record["seconds"])
                    results.append(result)
                    if log:
                        print(
                            f"{script}:{mutant.line} {mutant.kind} {mutant.description}: "
                            f"{result.outcome} ({result.seconds:.0f}s)"
                            + (f" by {result.killer}" if result.killer else ""),
                            flush=True,
                        )
                seen = len(lines)
                if done:
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.terminate()
            output = proc.communicate()[0]
        if seen == 0 or proc.returncode not in (0, 1, 5):
            tail = output.decode(errors="replace")[-3000:]
            raise SystemExit(f"pytest exited with {proc.returncode} for {script}:\n{tail}")


def report(results: list[Result], scripts: list[str]) -> str:
    lines = [
        "# Lua mutation report",
        "",
        "| script | mutants | killed | survived | killed % |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for script in scripts:
        mine = [r for r in results if r.mutant.script == script]
        if not mine:
            continue
        killed = sum(r.outcome == "killed" for r in mine)
        survived = len(mine) - killed
        lines.append(
            f"| {script} | {len(mine)} | {killed} | {survived} | {100 * killed / len(mine):.0f} |"
        )
    survivors = [r for r in results if r.outcome == "survived"]
    if survivors:
        lines += ["", "## Survivors", ""]
        for r in survivors:
            m = r.mutant
            text = m.source.split("\n")[m.line - 1].strip()
            lines.append(f"- `{m.script}.lua:{m.line}` {m.kind} ({m.description}): `{text}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.lua", description=__doc__)
    parser.add_argument(
        "scripts", nargs="*", help="script names (default: the state-transition scripts)"
    )
    parser.add_argument("--all", action="store_true", help="every script under asyncq/_broker/lua")
    parser.add_argument("--kinds", help="comma-separated mutant kinds to run (default: all)")
    parser.add_argument(
        "--lines", help="comma-separated line numbers to mutate (re-checking survivors)"
    )
    parser.add_argument("--indices", action="store_true", help="mutate KEYS/ARGV indices too")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument(
        "--report", type=Path, default=ROOT / "lua-mutation-report.md", help="Markdown report"
    )
    args = parser.parse_args(argv)
    if args.all:
        scripts = sorted(p.stem for p in LUA.glob("*.lua"))
    else:
        scripts = args.scripts or list(STATE_TRANSITIONS)
    for script in scripts:
        if not (LUA / f"{script}.lua").is_file():
            parser.error(f"no script {script!r} under {LUA}")
    only = set(args.kinds.split(",")) if args.kinds else None
    lines = {int(n) for n in args.lines.split(",")} if args.lines else None
    if args.list:
        for script in scripts:
            for m in mutants(script, committed(script), indices=args.indices):
                if (not only or m.kind in only) and (not lines or m.line in lines):
                    print(f"{script}:{m.line} {m.kind} {m.description}")
        return 0
    results: list[Result] = []
    # SIGTERM unwinds like Ctrl-C, so the pytest process of the script is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for script in scripts:
            mutate_script(script, results, indices=args.indices, only=only, lines=lines)
    finally:
        args.report.write_text(report(results, scripts), encoding="utf-8")
        print(f"report: {args.report}")
    return 1 if any(r.outcome == "survived" for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
