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
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.mutation.runner import SPEC, as_run, committed

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "asyncq" / "_broker" / "lua"
EQUIVALENTS = Path(__file__).with_name("equivalent.toml")

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
    "tests/broker/test_broker.py",
    "tests/broker/test_broker_processing.py",
    "tests/broker/test_broker_batch.py",
    "tests/broker/test_dequeue_edges.py",
    "tests/broker/test_script_no_partial_write.py",
    "tests/broker/test_model_state_machine.py",
    "tests/broker/test_lua_boundaries.py",
)
INSPECTOR_TESTS = (
    "tests/inspection/test_inspector.py",
    "tests/inspection/test_inspector_broker.py",
    "tests/broker/test_script_no_partial_write.py",
    "tests/broker/test_model_state_machine.py",
    "tests/broker/test_lua_boundaries.py",
)
MULTI_TESTS = (
    # dequeue_queues.lua called directly, its whole reply compared: fast, so first
    "tests/broker/test_dequeue_script.py",
    *BROKER_TESTS,
    "tests/broker/test_many_queues.py",
    "tests/worker/test_flow_control.py",
    "tests/broker/test_hostile_multiqueue.py",
)
WORKFLOW_TESTS = (
    # the scripts driven without a worker first: a mutant they kill costs no wait
    "tests/workflow/test_workflow_scripts.py",
    "tests/workflow/test_workflow.py",
    "tests/workflow/test_workflow_batch.py",
    "tests/broker/test_script_no_partial_write.py",
    "tests/broker/test_lua_boundaries.py",
)
DURABLE_TESTS = (
    # the scripts driven without a worker first: a mutant they kill costs no wait
    "tests/durable/test_durable_scripts.py",
    "tests/durable/test_durable_continue.py",
    "tests/durable/test_durable_inline.py",
    "tests/durable/test_durable.py",
)
DEFAULT_TESTS = BROKER_TESTS
TESTS: dict[str, tuple[str, ...]] = {
    # ack_many.lua acknowledges workflow steps too (the w/W kinds), and durable steps (r/R,
    # h/H, and i/I: inline)
    "ack_many": (
        *BROKER_TESTS,
        "tests/workflow/test_workflow_scripts.py",
        "tests/workflow/test_workflow_batch.py",
        "tests/workflow/test_workflow.py",
        "tests/durable/test_durable_scripts.py",
        "tests/durable/test_durable_continue.py",
        "tests/durable/test_durable_inline.py",
    ),
    # bad() and typed(), included by every script that writes: typed()'s "is it there"
    # answer is read by durable_suspend.lua
    "_lib/guard": (*BROKER_TESTS, "tests/durable/test_durable_scripts.py"),
    # may_hand_on() and lease_to_caller() (included by durable_suspend.lua, and with
    # record_step() by durable_step_done.lua and ack_many.lua)
    "_lib/handoff": DURABLE_TESTS,
    # record_step() (included by durable_step_done.lua and ack_many.lua)
    "_lib/durable_step": DURABLE_TESTS,
    # finish_step() (included by workflow_done.lua and durable_step_done.lua)
    "_lib/step_ack": (
        "tests/workflow/test_workflow_scripts.py",
        "tests/durable/test_durable_scripts.py",
        "tests/workflow/test_workflow.py",
        "tests/durable/test_durable.py",
    ),
    "ack_queues": (*BROKER_TESTS, "tests/workflow/test_workflow_batch.py"),
    # enqueue.lua's direct delivery: its own tests first (a real subscriber, fast)
    "enqueue": (
        "tests/broker/test_delivery.py",
        "tests/broker/test_delivery_rule.py",
        *BROKER_TESTS,
    ),
    "dequeue_queues": MULTI_TESTS,
    # the rule both take a task by (included by dequeue_queues.lua and enqueue.lua): the
    # fetch's tests, then the delivery's
    "_lib/room": (
        *MULTI_TESTS,
        "tests/broker/test_delivery_rule.py",
        "tests/broker/test_delivery.py",
    ),
    "forward_queues": MULTI_TESTS,
    "list_lease_expired_queues": MULTI_TESTS,
    "delete_expired_completed_queues": MULTI_TESTS,
    "reclaim_stale_aggregation_sets_queues": MULTI_TESTS,
    "aggregation_check": (
        *BROKER_TESTS,
        "tests/broker/test_broker_records.py",
        "tests/worker/test_aggregator.py",
    ),
    "read_aggregation_set": (*BROKER_TESTS, "tests/broker/test_broker_records.py"),
    "delete_aggregation_set": (*BROKER_TESTS, "tests/broker/test_broker_records.py"),
    # the scheduler's tick claim and listing lease: the scripts called directly first,
    # then garbage under a scheduler, then schedulers taking a dead claimant's tick over
    "scheduler_claim": (
        "tests/scheduling/test_cron_lease_scripts.py",
        "tests/scheduling/test_cron_keys_hostile.py",
        "tests/scheduling/test_scheduler.py",
    ),
    "scheduler_listing": (
        "tests/scheduling/test_cron_lease_scripts.py",
        "tests/scheduling/test_cron_keys_hostile.py",
        "tests/scheduling/test_app_cron.py",
    ),
    # a run's cancel is tested with the Inspector that calls it
    "durable_cancel": ("tests/durable/test_durable_inspect.py",),
    # the failure triage's bulk actions are tested with the error groups they act on
    "inspect_error_group_action": (*INSPECTOR_TESTS, "tests/inspection/test_triage.py"),
}
STATE_TRANSITIONS = (
    "enqueue", "enqueue_unique", "enqueue_many", "schedule", "schedule_unique", "add_to_group",
    "add_to_group_unique", "dequeue_queues", "done", "mark_as_complete",
    "ack_many", "requeue", "retry", "archive", "forward_queues",
    "list_lease_expired_queues", "delete_expired_completed_queues", "aggregation_check",
    "reclaim_stale_aggregation_sets_queues", "delete_aggregation_set", "inspect_run_task",
    "inspect_delete_task", "inspect_archive_task", "ack_queues", "archive_undecodable",
    "workflow_start", "workflow_advance", "workflow_done", "workflow_member_gone",
    "workflow_cancel", "durable_suspend", "durable_inline", "durable_step_done", "durable_signal",
    "durable_record", "durable_start", "inspect_run_all", "inspect_run_all_aggregating",
    "inspect_archive_all", "inspect_archive_all_pending", "inspect_archive_all_aggregating",
    "inspect_delete_all", "inspect_delete_all_pending", "inspect_delete_all_aggregating",
    "inspect_remove_queue", "inspect_error_group_action",
)  # fmt: skip


def tests_for(script: str) -> tuple[str, ...]:
    if script in TESTS:
        return TESTS[script]
    if script.startswith("inspect_"):
        return INSPECTOR_TESTS
    if script.startswith("workflow_"):
        return WORKFLOW_TESTS
    if script.startswith("durable_"):
        return DURABLE_TESTS
    return TESTS.get(script, DEFAULT_TESTS)


@dataclass(frozen=True)
class Mutant:
    script: str
    line: int  # 1-based
    kind: str
    description: str
    source: str  # the whole mutated script
    text: str  # the unmutated line, stripped
    nth: int = 1  # the same change made at the nth place of the line

    @property
    def key(self) -> str:
        """Names the mutant within its script's current text (results are matched by it)."""
        return f"{self.line}:{self.kind}:{self.description}#{self.nth}"


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
            word = "or" if m.group(1) == "and" else "and"
            yield "logic", f"{m.group(1)} -> {word}", line[: m.start()] + word + line[m.end() :]
        else:
            yield "logic", "drop not", line[: m.start()] + line[m.end() :]


def mutants(script: str, source: str, *, indices: bool = False) -> list[Mutant]:
    lines = source.split("\n")
    out: list[Mutant] = []
    for n, line in enumerate(lines):
        seen: dict[tuple[str, str], int] = {}
        for kind, desc, new in line_mutants(line, indices=indices):
            if new == line:
                continue
            nth = seen[kind, desc] = seen.get((kind, desc), 0) + 1
            text = "\n".join([*lines[:n], new, *lines[n + 1 :]])
            out.append(Mutant(script, n + 1, kind, desc, text, line.strip(), nth))
    return out


@dataclass(frozen=True)
class Equivalent:
    """A survivor judged equivalent (tests/mutation/equivalent.toml): no test can kill it
    because the script behaves the same for every input its callers can give."""

    script: str
    text: str  # the unmutated line, stripped
    mutation: str  # the mutant's description, such as "0 -> 1" or "if true"
    reason: str
    nth: int | None = None  # which of several identical changes on the line; None: each
    line: int | None = None  # which of several identical lines of the script; None: each

    def covers(self, m: Mutant) -> bool:
        return (
            m.script == self.script
            and m.text == self.text
            and m.description == self.mutation
            and (self.nth is None or self.nth == m.nth)
            and (self.line is None or self.line == m.line)
        )


def load_equivalents(path: Path = EQUIVALENTS) -> list[Equivalent]:
    data = tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return [Equivalent(**entry) for entry in data.get("equivalent", [])]


def equivalent_of(m: Mutant, judged: list[Equivalent]) -> Equivalent | None:
    return next((e for e in judged if e.covers(m)), None)


def fingerprint(script: str) -> str:
    """The script as Redis runs it (committed, includes expanded), hashed: results of a
    run on another text of the script are not reported."""
    return hashlib.sha1(as_run(script, committed(script)).encode()).hexdigest()[:12]


OUTCOMES = ("killed", "timeout", "survived", "undecided")
"""killed: a test failed on an assertion or an error and passes unmutated; timeout: a
test ran out of time twice on the mutant and passes unmutated (the mutant hangs or
stalls); survived: every test passed; undecided: the failing test failed unmutated
too, so the machine could not judge (run it again)."""


@dataclass
class Result:
    mutant: Mutant
    outcome: str  # one of OUTCOMES
    killer: str | None  # the test that failed first
    seconds: float
    message: str = ""  # the killing failure, one line


def save(results_file: Path, result: Result, stamp: str) -> None:
    m = result.mutant
    record = {
        "script": m.script,
        "fingerprint": stamp,
        "key": m.key,
        "outcome": result.outcome,
        "killer": result.killer,
        "message": result.message,
        "seconds": round(result.seconds, 1),
    }
    with results_file.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def load_results(results_file: Path, scripts: list[str]) -> list[Result]:
    """The latest outcome of each current mutant of *scripts* in *results_file*."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    stamps = {s: fingerprint(s) for s in scripts}
    if results_file.is_file():
        for line in results_file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if stamps.get(record["script"]) == record["fingerprint"]:
                latest[record["script"], record["key"]] = record
    out = []
    for script in scripts:
        for m in mutants(script, committed(script)):
            record = latest.get((script, m.key))
            if record is not None:
                out.append(
                    Result(
                        m,
                        str(record["outcome"]),
                        record["killer"],
                        float(record["seconds"]),
                        str(record.get("message", "")),
                    )
                )
    return out


def mutate_script(
    script: str,
    results: list[Result],
    *,
    indices: bool,
    only: set[str] | None,
    lines: set[int] | None = None,
    skip: frozenset[str] | set[str] = frozenset(),
    judged: list[Equivalent] | None = None,
    results_file: Path | None = None,
    tests: tuple[str, ...] = (),
    log: bool = True,
) -> None:
    """Run every mutant of *script* in one pytest process (tests/mutation/runner.py),
    appending each outcome to *results* (and *results_file*) as it comes, so an
    interrupted run still reports what it finished. Mutants judged equivalent and the
    ones whose keys are in *skip* are not run."""
    original = committed(script)
    stamp = fingerprint(script)
    todo = [
        m
        for m in mutants(script, original, indices=indices)
        if (not only or m.kind in only)
        and (not lines or m.line in lines)
        and m.key not in skip
        and (judged is None or equivalent_of(m, judged) is None)
    ]
    if not todo:
        return
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
            "--timeout", "120", *(tests or tests_for(script)),
        ]  # fmt: skip
        env = {**os.environ, SPEC: str(spec), "ASYNCQ_HYPOTHESIS_PROFILE": "mutation"}
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        seen = 0
        try:
            while True:
                done = proc.poll() is not None
                records = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
                for line in records[seen:]:
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
                    result = Result(
                        mutant,
                        record["outcome"],
                        record["killer"],
                        record["seconds"],
                        record.get("message", ""),
                    )
                    results.append(result)
                    # passing a part of the selection proves nothing: only kills count
                    if results_file is not None and not (tests and result.outcome == "survived"):
                        save(results_file, result, stamp)
                    if log:
                        by = f" by {result.killer}: {result.message[:120]}" if result.killer else ""
                        print(
                            f"{script}:{mutant.line} {mutant.kind} {mutant.description}: "
                            f"{result.outcome} ({result.seconds:.0f}s){by}",
                            flush=True,
                        )
                seen = len(records)
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


def report(results: list[Result], scripts: list[str], judged: list[Equivalent]) -> str:
    """The Markdown report: per script its mutants and their outcomes, the kill rate of
    the non-equivalent ones, then each survivor, each equivalent with its reason, and
    each kill made by a timeout."""
    lines = [
        "# Lua mutation report",
        "",
        "killed: a test failed on an assertion or error (and passes unmutated); timeout: a",
        "test ran out of time twice on the mutant and passes unmutated; equivalent: judged",
        "in tests/mutation/equivalent.toml, not run; not run: no outcome for the script's",
        "current text. Kill % = (killed + timeout) / (mutants - equivalent); for a script",
        "not run to the end, the same over the mutants run so far.",
        "",
        "| script | mutants | killed | timeout | survived | undecided | equivalent | not run "
        "| kill % of non-equivalent |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    by_key = {(r.mutant.script, r.mutant.key): r for r in results}
    survivors: list[Result] = []
    equivalents: list[tuple[Mutant, Equivalent]] = []
    timeouts: list[Result] = []
    for script in scripts:
        every = mutants(script, committed(script))
        count = dict.fromkeys((*OUTCOMES, "equivalent", "not run"), 0)
        for m in every:
            e = equivalent_of(m, judged)
            r = by_key.get((script, m.key))
            if e is not None:
                count["equivalent"] += 1
                equivalents.append((m, e))
            elif r is None:
                count["not run"] += 1
            else:
                count[r.outcome] += 1
                if r.outcome in ("survived", "undecided"):
                    survivors.append(r)
                elif r.outcome == "timeout":
                    timeouts.append(r)
        live = len(every) - count["equivalent"]
        ran = live - count["not run"]
        if count["not run"] and ran:
            so_far = 100 * (count["killed"] + count["timeout"]) / ran
            rate = f"incomplete ({so_far:.1f} of the {ran} run)"
        elif count["not run"]:
            rate = "not run"
        elif live == 0:
            rate = "-"
        else:
            rate = f"{100 * (count['killed'] + count['timeout']) / live:.1f}"
        lines.append(
            f"| {script} | {len(every)} | {count['killed']} | {count['timeout']} "
            f"| {count['survived']} | {count['undecided']} | {count['equivalent']} "
            f"| {count['not run']} | {rate} |"
        )
    if survivors:
        lines += ["", "## Survivors and undecided", ""]
        for r in survivors:
            m = r.mutant
            lines.append(
                f"- `{m.script}.lua:{m.line}` {r.outcome}, {m.kind} ({m.description}): `{m.text}`"
            )
    if equivalents:
        lines += ["", "## Judged equivalent", ""]
        for m, e in equivalents:
            lines.append(
                f"- `{m.script}.lua:{m.line}` {m.kind} ({m.description}) on `{m.text}`: {e.reason}"
            )
    if timeouts:
        lines += ["", "## Killed by a timeout (twice on the mutant, passing unmutated)", ""]
        for r in timeouts:
            m = r.mutant
            lines.append(
                f"- `{m.script}.lua:{m.line}` {m.kind} ({m.description}): {r.killer}: {r.message}"
            )
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
        "--resume",
        action="store_true",
        help="skip the mutants the results file already has an outcome for (on this text)",
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run only the mutants whose latest outcome is survived or undecided",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="write the report from the results file"
    )
    parser.add_argument(
        "--tests",
        help="comma-separated test files or node ids to run instead of the script's selection "
        "(a quick re-check of survivors against new tests; a survivor stays one until the "
        "whole selection has passed)",
    )
    parser.add_argument(
        "--run-equivalent", action="store_true", help="run the judged-equivalent mutants too"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=ROOT / "lua-mutation-results.jsonl",
        help="every outcome is appended here; the report uses the latest per mutant",
    )
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
    judged = load_equivalents()
    if args.list:
        for script in scripts:
            for m in mutants(script, committed(script), indices=args.indices):
                if (not only or m.kind in only) and (not lines or m.line in lines):
                    e = equivalent_of(m, judged)
                    print(
                        f"{script}:{m.line} {m.kind} {m.description}: {m.text}"
                        + (f"  [equivalent: {e.reason}]" if e else "")
                    )
        return 0
    results: list[Result] = []
    if not args.report_only:
        # SIGTERM unwinds like Ctrl-C, so the pytest process of the script is stopped too.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            for script in scripts:
                known = {r.mutant.key: r.outcome for r in load_results(args.results, [script])}
                skip: set[str] = set()
                if args.resume:
                    skip = set(known)
                if args.survivors:
                    every = {m.key for m in mutants(script, committed(script))}
                    skip = every - {k for k, o in known.items() if o in ("survived", "undecided")}
                mutate_script(
                    script,
                    results,
                    indices=args.indices,
                    only=only,
                    lines=lines,
                    skip=skip,
                    # read again for each script: survivors are judged while a run goes on
                    judged=None if args.run_equivalent else load_equivalents(),
                    results_file=args.results,
                    tests=tuple(args.tests.split(",")) if args.tests else (),
                )
        finally:
            final = load_results(args.results, scripts)
            args.report.write_text(report(final, scripts, judged), encoding="utf-8")
            print(f"report: {args.report}")
    final = load_results(args.results, scripts)
    args.report.write_text(report(final, scripts, judged), encoding="utf-8")
    if args.report_only:
        print(f"report: {args.report}")
    return 1 if any(r.outcome in ("survived", "undecided") for r in final) else 0


if __name__ == "__main__":
    raise SystemExit(main())
