"""A/B guard: two revisions of asyncq measured in turn, in the same minutes, as B/A ratios.

``python -m benchmarks.ab REV_A REV_B [--runs N]`` installs each revision (a commit, a
branch, ``HEAD``, or the path of a working tree, uncommitted work included) into its
own virtualenv, with every other package pinned to the version installed in the
environment running this tool, so that only asyncq differs between the two. Then, on
one throwaway redis-server over TCP, it runs N rounds; each round measures the
physical rows (``redis-benchmark`` SET with 1 and 32 clients, one Pub/Sub hop, a plain
redis-py asyncio SET) and then the asyncq phases of ``python -m benchmarks`` (the same
driver, :mod:`benchmarks.systems.asyncq`) for A, then for B. Every metric is printed as
B/A: the median of the rounds' ratios with their min–max (a ratio is taken within a
round, so drift of a shared machine between rounds cancels), then the raw figures.

See benchmarks/README.md ("A/B: two revisions"). Standard library only; needs ``git``,
``uv`` and ``redis-server`` on PATH (``redis-benchmark`` for its rows).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import runner

ROOT = runner.ROOT
CACHE = runner.ENVS / "ab"
"""Where ``--cache`` keeps one environment per commit (git-ignored with benchmarks/.envs)."""
SIDES = ("A", "B")
INSTALL = "--compile-bytecode"
"""Byte-compiled at install, as pip installs a package. uv does not compile by default,
and where PYTHONDONTWRITEBYTECODE is set (it is on the shared machines) every process
would compile the source of each module it imports: a module a revision imports once
its worker has started (pydantic, through betterproto2's first heartbeat) would charge
its compilation to the worker's CPU per task."""


def log(message: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- revisions


@dataclasses.dataclass
class Revision:
    """One side of the comparison: what was asked for and what was installed."""

    spec: str  # as given on the command line
    commit: str  # full sha of a git revision; "" for a working tree
    describe: str  # `git describe --always --dirty` (of the tree, for a path)
    path: Path | None  # the working tree, for a path revision
    python: Path | None = None
    freeze: list[str] = dataclasses.field(default_factory=list)
    variant: str = ""  # the asyncq adapter's --variant for this side ("" = defaults)

    def describe_json(self) -> dict[str, str | None]:
        return {
            "spec": self.spec,
            "commit": self.commit,
            "describe": self.describe,
            "path": str(self.path) if self.path else None,
            "label": self.label,
            "variant": self.variant,
        }

    @property
    def label(self) -> str:
        if self.path is not None:
            name = f"{self.spec} (working tree, {self.describe})"
        else:
            short = self.commit[:7]
            name = short if self.spec.startswith(short) else f"{self.spec} ({short})"
        return f"{name} [{self.variant}]" if self.variant else name


def _git(*args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip()


def resolve(spec: str) -> Revision:
    """*spec* as a directory holding a checkout of asyncq, or else as a git revision."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path.resolve()
        if not (path / "pyproject.toml").exists() or not (path / "asyncq").is_dir():
            raise SystemExit(f"{spec}: not a checkout of asyncq (no pyproject.toml and asyncq/)")
        try:
            describe = _git("describe", "--always", "--dirty", cwd=path)
        except RuntimeError:
            describe = "not a git checkout"
        return Revision(spec, "", describe, path)
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except RuntimeError:
        raise SystemExit(f"{spec}: neither a directory nor a git revision of {ROOT}") from None
    return Revision(spec, commit, _git("describe", "--always", commit), None)


def pinned_requirements() -> list[str]:
    """This environment's packages as ``name==version``, asyncq and local installs left out.

    Given to uv as constraints, they make both revisions' environments install the
    same version of every dependency: only asyncq differs.
    """
    out = _uv("pip", "freeze", "--python", sys.executable)
    return [
        line
        for line in out.splitlines()
        if line
        and not line.startswith(("-e ", "#"))
        and " @ " not in line  # a local or URL install cannot be pinned by version
        and _name(line) != "asyncq"
    ]


def _name(requirement: str) -> str:
    return requirement.split("==", 1)[0].strip().lower().replace("_", "-")


def _uv(*args: str) -> str:
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv is not on PATH (https://docs.astral.sh/uv/; pip install uv)")
    proc = subprocess.run([uv, *args], capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"uv {' '.join(args[:2])} failed:\n{proc.stderr.strip()[-3000:]}")
    return proc.stdout


def _snapshot(tree: Path, dest: Path) -> None:
    """Copy *tree*'s files as git sees them (tracked and untracked, ignored ones left
    out) into *dest*: the build writes into its source directory (build/, *.egg-info),
    which must not be the user's working tree, and this pins what is measured."""
    try:
        listing = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=tree)
        files = [f for f in listing.split("\0") if f]
    except RuntimeError:  # not a git checkout: everything but the usual build debris
        shutil.copytree(
            tree,
            dest,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", ".nox", "node_modules", ".envs", "build", "*.egg-info",
                "__pycache__", "site",
            ),
        )  # fmt: skip
        return
    for name in files:
        src = tree / name
        if src.is_file():  # a deleted but still tracked file is listed too
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def build(rev: Revision, pins: Sequence[str], work: Path, *, cache: bool) -> None:
    """Install *rev* into a virtualenv of its own, under *work* or, with *cache* and a
    commit, under benchmarks/.envs/ab/ (reused while the pins are the same)."""
    key = hashlib.sha256(
        "\n".join([platform.python_version(), sys.executable, INSTALL, *pins]).encode()
    ).hexdigest()[:12]
    if cache and rev.commit:
        env = CACHE / f"{rev.commit[:12]}-{key}"
    else:
        tag = hashlib.sha256(rev.spec.encode()).hexdigest()[:6]
        env = work / f"env-{rev.commit[:12] or 'tree'}-{tag}"
    marker = env / "ab-installed"
    rev.python = env / "bin" / "python"
    if marker.exists():
        log(f"{rev.label}: reusing {env}")
        rev.freeze = marker.read_text().splitlines()
        return
    src = work / f"src-{hashlib.sha256(str(env).encode()).hexdigest()[:8]}"
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    started = time.monotonic()
    shutil.rmtree(env, ignore_errors=True)
    try:
        if rev.path is not None:
            _snapshot(rev.path, src)
        else:
            _git("worktree", "add", "--detach", str(src), rev.commit)
        _uv("venv", "--quiet", "--python", sys.executable, str(env))
        # Not editable: the worktree is removed once installed, and an editable install of
        # a working tree would measure whatever the tree holds when the worker starts.
        _uv(
            "pip", "install", "--quiet", INSTALL, "--python", str(rev.python),
            "--constraint", str(constraints), f"{src}[uvloop]",
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(env, ignore_errors=True)
        raise
    finally:
        if rev.path is None and src.exists():
            with contextlib.suppress(RuntimeError):
                _git("worktree", "remove", "--force", str(src))
        shutil.rmtree(src, ignore_errors=True)
    rev.freeze = _uv("pip", "freeze", "--python", str(rev.python)).splitlines()
    marker.write_text("\n".join(rev.freeze) + "\n")
    log(f"{rev.label}: installed in {env} ({time.monotonic() - started:.0f} s)")


def dependency_differences(a: Revision, b: Revision) -> list[str]:
    """Packages other than asyncq whose versions differ between the two environments."""

    def versions(freeze: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in freeze:
            if line and not line.startswith("#") and "==" in line:
                name, _, version = line.partition("==")
                out[_name(name)] = version.strip()
            elif " @ " in line:
                out[_name(line.split(" @ ", 1)[0])] = line.split(" @ ", 1)[1]
        out.pop("asyncq", None)
        return out

    va, vb = versions(a.freeze), versions(b.freeze)
    return [
        f"{name}: A {va.get(name, '-')}, B {vb.get(name, '-')}"
        for name in sorted(va.keys() | vb.keys())
        if va.get(name) != vb.get(name)
    ]


def harness(work: Path) -> Path:
    """A copy of this checkout's ``benchmarks`` package, alone in a directory: the
    measuring code is the same for both sides, and no ``asyncq`` source sits beside it
    to shadow the revision installed in each environment."""
    root = work / "harness"
    shutil.copytree(
        ROOT / "benchmarks",
        root / "benchmarks",
        ignore=shutil.ignore_patterns(".envs", "node", "results", "__pycache__", "*.md"),
    )
    return root


# --------------------------------------------------------------------------- metrics


Records = dict[str, Any]
"""One asyncq run's records by phase, with the round's physical records under ``_ref``."""


@dataclasses.dataclass(frozen=True)
class Metric:
    label: str
    get: Callable[[Records], float | None]
    fmt: str  # "rate", "us", "ms", "ratio", "float"
    better: str  # "higher" or "lower"


def _field(phase: str, key: str) -> Callable[[Records], float | None]:
    def get(records: Records) -> float | None:
        value = records.get(phase, {}).get(key)
        return None if value is None else float(value)

    return get


def _over_ref(
    phase: str, key: str, ref_phase: str, ref_key: str
) -> Callable[[Records], float | None]:
    """*phase*'s *key* over the same round's physical record *ref_phase*'s *ref_key*."""

    def get(records: Records) -> float | None:
        ours = records.get(phase, {}).get(key)
        ref = records.get("_ref", {}).get(ref_phase, {}).get(ref_key)
        return None if ours is None or not ref else float(ours) / float(ref)

    return get


METRICS = (
    Metric("enqueue, serial, tasks/s", _field("enqueue_serial", "tasks_per_s"), "rate", "higher"),
    Metric("  ÷ redis-benchmark SET, 1 client",
           _over_ref("enqueue_serial", "tasks_per_s", "set_c1", "tasks_per_s"), "ratio", "higher"),
    Metric("client CPU µs / serial enqueue",
           _field("enqueue_serial", "client_cpu_us_per_task"), "us", "lower"),
    Metric("  ÷ redis-py SET client CPU µs",
           _over_ref("enqueue_serial", "client_cpu_us_per_task", "redispy_set",
                     "client_cpu_us_per_task"), "ratio", "lower"),
    Metric("  ÷ event-loop floor client CPU µs",
           _over_ref("enqueue_serial", "client_cpu_us_per_task", "redispy_set",
                     "floor_cpu_us_per_call"), "ratio", "lower"),
    Metric("enqueue, 32 callers, tasks/s", _field("enqueue_c32", "tasks_per_s"), "rate", "higher"),
    Metric("  ÷ redis-benchmark SET, 32 clients",
           _over_ref("enqueue_c32", "tasks_per_s", "set_c32", "tasks_per_s"), "ratio", "higher"),
    Metric("enqueue, 1,000 callers, tasks/s", _field("enqueue_c1000", "tasks_per_s"), "rate",
           "higher"),
    Metric("enqueue, batch (enqueue_many), tasks/s", _field("enqueue_fast", "tasks_per_s"),
           "rate", "higher"),
    Metric("process, 1 worker, conc. 100, tasks/s", _field("process", "tasks_per_s"), "rate",
           "higher"),
    Metric("worker CPU µs / task", _field("process", "worker_cpu_us_per_task"), "us", "lower"),
    Metric("redis-server CPU µs / task, process", _field("process", "redis_cpu_us_per_task"),
           "us", "lower"),
    Metric("Redis commands / task, process", _field("process", "redis_cmds_per_task"), "float",
           "lower"),
    Metric("pickup p50 ms", _field("latency", "p50_ms"), "ms", "lower"),
    Metric("pickup p99 ms", _field("latency", "p99_ms"), "ms", "lower"),
    Metric("  pickup p50 ÷ one Pub/Sub hop p50",
           _over_ref("latency", "p50_ms", "hop", "p50_ms"), "ratio", "lower"),
)  # fmt: skip
"""The asyncq rows, each shown as A, B and B/A."""

PHYSICAL = (
    Metric("redis-benchmark SET, 1 client, req/s", _field("set_c1", "tasks_per_s"), "rate",
           "higher"),
    Metric("redis-benchmark SET, 32 clients, req/s", _field("set_c32", "tasks_per_s"), "rate",
           "higher"),
    Metric("one Pub/Sub hop p50 ms", _field("hop", "p50_ms"), "ms", "lower"),
    Metric("one Pub/Sub hop p99 ms", _field("hop", "p99_ms"), "ms", "lower"),
    Metric("redis-py asyncio SET, serial, req/s", _field("redispy_set", "tasks_per_s"), "rate",
           "higher"),
    Metric("redis-py asyncio SET, client CPU µs / call",
           _field("redispy_set", "client_cpu_us_per_task"), "us", "lower"),
    Metric("event-loop floor (bare Protocol SET), client CPU µs / call",
           _field("redispy_set", "floor_cpu_us_per_call"), "us", "lower"),
)  # fmt: skip
"""The rows measured once per round, beside both sides (the machine, not asyncq)."""


def _fmt(value: float, kind: str) -> str:
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "us":
        return f"{value:.1f}"
    if kind == "ms":
        return f"{value:.2f}"
    if kind == "ratio":
        return f"{value:.2f}×"
    return f"{value:.2f}"


def _cell(values: Sequence[float], kind: str) -> str:
    if not values:
        return "–"
    text = _fmt(statistics.median(values), kind)
    if len(values) > 1:
        text += f" ({_fmt(min(values), kind)}–{_fmt(max(values), kind)})"
    return text


def _values(
    rounds: Sequence[dict[str, Any]], side: str, get: Callable[[Records], float | None]
) -> list[float | None]:
    out: list[float | None] = []
    for rnd in rounds:
        res = rnd.get(side)
        if res is None or res["error"]:  # a failed run's figures are not compared
            out.append(None)
            continue
        out.append(get({**res["records"], "_ref": rnd["physical"]}))
    return out


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: each side's value in every round, and B/A within every round."""
    out: dict[str, Any] = {}
    for m in METRICS:
        a = _values(rounds, "A", m.get)
        b = _values(rounds, "B", m.get)
        ratios = [y / x if x and y is not None else None for x, y in zip(a, b, strict=True)]
        out[m.label] = {"A": a, "B": b, "B/A": ratios, "better": m.better, "fmt": m.fmt}
    for m in PHYSICAL:
        phys = [m.get(rnd["physical"]) for rnd in rounds]
        out[m.label] = {"round": phys, "better": m.better, "fmt": m.fmt}
    return out


def _present(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def render_table(summary: dict[str, Any], a: Revision, b: Revision, n_runs: int) -> str:
    """Each metric: A and B (median and min–max over the rounds), B/A (median and
    min–max of the per-round ratios); then the physical rows, measured once per round."""
    lines = [
        f"| metric | A: {a.label} | B: {b.label} | B/A | better |",
        "|---|---:|---:|---:|---|",
    ]
    for m in METRICS:
        row = summary[m.label]
        ratio = _cell(_present(row["B/A"]), "ratio")
        lines.append(
            f"| {m.label} | {_cell(_present(row['A']), m.fmt)} | "
            f"{_cell(_present(row['B']), m.fmt)} | {ratio} | {m.better} |"
        )
    lines += ["", "| physical reference (once per round, beside both) | value |", "|---|---:|"]
    for m in PHYSICAL:
        lines.append(f"| {m.label} | {_cell(_present(summary[m.label]['round']), m.fmt)} |")
    note = f"median (min–max) of {n_runs} rounds" if n_runs > 1 else "one round"
    lines += [
        "",
        f"Cells: {note}. B/A is taken within each round (B's value over A's in the same"
        " round), then summarized; 'better' says which way is an improvement. Ratios"
        " marked ÷ divide by the same round's physical row.",
    ]
    return "\n".join(lines)


def render_raw(summary: dict[str, Any], orders: Sequence[Sequence[str]]) -> str:
    """Every figure of every round, in the order measured (A1 B1 A2 B2 ..., or with
    ``--order abba`` A1 B1 B2 A2 ...); *orders* is each round's order of the sides."""
    n_runs = len(orders)
    slots = [(k, side) for k, order in enumerate(orders) for side in order]
    heads = [f"{side}{k + 1}" for k, side in slots]
    lines = ["| metric | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]

    def show(v: float | None, kind: str) -> str:
        return "–" if v is None else _fmt(v, kind)

    for m in METRICS:
        row = summary[m.label]
        cells = [show(row[side][k], m.fmt) for k, side in slots]
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    phys_heads = [f"round {k + 1}" for k in range(n_runs)]
    lines += ["", "| physical | " + " | ".join(phys_heads) + " |", "|---|" + "---:|" * n_runs]
    for m in PHYSICAL:
        cells = [show(v, m.fmt) for v in summary[m.label]["round"]]
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- rounds


def physical_round(
    url: str, args: argparse.Namespace, harness_root: Path, python: Path, timeout: float
) -> tuple[dict[str, Any], list[str]]:
    """The machine's rows for one round, and what failed (a missing tool is not a failure)."""
    records: dict[str, Any] = {}
    errors: list[str] = []
    try:
        ref = runner.run_reference(
            url, runner._sizes(args, url), timeout, runner._run_config(args, url)
        )
    except runner.Skipped as exc:
        log(f"physical rows: {exc}")
    else:
        if ref["error"]:
            errors.append(f"redis-benchmark: {ref['error']}")
        recs = ref["records"]
        for ours, theirs in (("set_c1", "enqueue_serial"), ("set_c32", "enqueue_c32")):
            if theirs in recs:
                records[ours] = recs[theirs]
        if "latency" in recs:
            records["hop"] = recs["latency"]
    rec, error = runner.run_redispy_set(
        url, runner._run_config(args, url).serial_n, python, harness_root, timeout
    )
    if rec is not None:
        records["redispy_set"] = rec
    else:
        errors.append(str(error))
    return records, errors


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.ab",
        description=(
            "Two revisions of asyncq, each installed in its own environment (every other"
            " package at the version of this one), measured in alternation (A, B, A, B, ...)"
            " on one throwaway redis-server over TCP, with the physical rows in every round;"
            " prints each metric as B/A with min–max, then the raw figures."
        ),
    )
    p.add_argument("rev_a", metavar="REV_A", help="a commit, branch, HEAD, or a working tree")
    p.add_argument("rev_b", metavar="REV_B", help="the same, measured second in each round")
    p.add_argument("--runs", type=int, default=3, help="rounds, each A then B (3)")
    p.add_argument(
        "--order",
        choices=("ab", "abba"),
        default="ab",
        help="ab: every round A then B (default); abba: B first in every other round",
    )
    p.add_argument("--quick", action="store_true", help="small N: a smoke run, not results")
    p.add_argument("--n", type=int, help="tasks for 32/1,000 callers, batch and process (20000)")
    p.add_argument("--serial-n", type=int, help="tasks for serial enqueue (5000)")
    p.add_argument("--latency-n", type=int, help="pickup latency samples (200)")
    p.add_argument("--concurrency", type=int, help="worker concurrency (100)")
    p.add_argument("--batch-size", type=int, help="tasks per enqueue_many call (0 = all)")
    p.add_argument("--settle", type=float, help="seconds to wait for late duplicates (1.0)")
    p.add_argument("--variant", help="asyncq variant for both sides (no-history, socket)")
    p.add_argument(
        "--variant-a",
        help="A's variant, instead of --variant: one commit against itself with a setting"
        " changed (HEAD HEAD --variant-b no-history: what the metrics history costs)",
    )
    p.add_argument("--variant-b", help="B's variant, instead of --variant")
    p.add_argument(
        "--redis-url", help="use this Redis instead of a throwaway one (ITS DATABASE IS FLUSHED)"
    )
    p.add_argument(
        "--cache",
        action="store_true",
        help="keep each commit's environment in benchmarks/.envs/ab/ and reuse it",
    )
    p.add_argument(
        "--pin",
        nargs="?",
        const="apart",
        choices=runner.PIN_MODES,
        help="redis-server on the first usable core, both sides and the physical rows on the"
        " others (apart, the default) or on the server's core too (shared); see the runner's"
        " --pin",
    )
    p.add_argument("--json", type=Path, help="output (default benchmarks/results/ab-<time>.json)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    return args


def _passthrough(args: argparse.Namespace, rev: Revision) -> list[str]:
    out = runner._passthrough(args)
    if rev.variant:
        out += ["--variant", rev.variant]
    return out


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="asyncq-ab-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join(["python -m benchmarks.ab", *(argv if argv is not None else sys.argv[1:])])
    a, b = resolve(args.rev_a), resolve(args.rev_b)
    a.variant = args.variant_a if args.variant_a is not None else args.variant or ""
    b.variant = args.variant_b if args.variant_b is not None else args.variant or ""
    timeout = 180.0 if args.quick else 1800.0
    started = datetime.now(UTC)
    with _workdir() as work:
        pins = pinned_requirements()
        log(f"pinning {len(pins)} packages from {sys.executable}'s environment")
        build(a, pins, work, cache=args.cache)
        if b.commit and b.commit == a.commit and not b.path and not a.path:
            b.python, b.freeze = a.python, a.freeze  # the same commit: one environment
        else:
            build(b, pins, work, cache=args.cache)
        differences = dependency_differences(a, b)
        for line in differences:
            log(f"dependency differs: {line}")
        root = harness(work)
        rounds: list[dict[str, Any]] = []
        failures: list[str] = []
        socket = "socket" in (a.variant, b.variant)  # the variant needs the unix socket
        with runner.measured_server(args.redis_url, pin_mode=args.pin, unix_socket=socket) as (
            url,
            machine,
        ):
            for k in range(args.runs):
                log(f"round {k + 1}/{args.runs}: physical rows")
                assert a.python is not None and b.python is not None
                physical, errors = physical_round(url, args, root, a.python, timeout)
                failures += [f"round {k + 1}: {e}" for e in errors]
                # abba: every other round measures B first, so that whatever drifts in
                # one direction over a round (a neighbour's load starting, Redis's memory)
                # does not always favour the side measured first.
                order = SIDES[::-1] if args.order == "abba" and k % 2 else SIDES
                rnd: dict[str, Any] = {"physical": physical, "order": list(order)}
                for side in order:
                    rev = a if side == "A" else b
                    log(f"round {k + 1}/{args.runs}: {side} = {rev.label}")
                    assert rev.python is not None
                    res = runner.run_system(
                        runner.SYSTEMS["asyncq"], rev.python, url, _passthrough(args, rev), timeout,
                        root=root,
                    )  # fmt: skip
                    rnd[side] = res
                    if res["error"]:
                        failures.append(f"round {k + 1} {side}: {res['error']}")
                        log(f"  {side} FAILED: {res['error']}")
                    for phase in ("process", "latency"):
                        rec = res["records"].get(phase)
                        if rec and (rec["handler_calls_minus_n"] or rec["lost"]):
                            failures.append(
                                f"round {k + 1} {side} {phase}: handler calls − N ="
                                f" {rec['handler_calls_minus_n']}, lost = {rec['lost']}"
                            )
                rounds.append(rnd)
    summary = summarize(rounds)
    table = render_table(summary, a, b, args.runs)
    raw = render_raw(summary, [rnd["order"] for rnd in rounds])
    n = rounds[0]["A"]["records"].get("process", {}).get("n", "?") if rounds else "?"
    heading = render_heading(
        started, machine, command, a=a, b=b, differences=differences, n=n, args=args
    )
    print(heading)
    print()
    print(table)
    print()
    print("Raw figures, in the order measured:")
    print()
    print(raw)
    out_path = args.json or runner.RESULTS / f"ab-{started:%Y-%m-%d-%H%M%S}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "schema": 1,
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "command": command,
        "machine": machine,
        "revisions": {side: r.describe_json() for side, r in zip(SIDES, (a, b), strict=True)},
        "dependency_differences": differences,
        "rounds": rounds,
        "summary": summary,
        "table": table,
        "raw": raw,
        "failures": failures,
    }
    out_path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    log(f"wrote {out_path}")
    if failures:
        log("failed: " + "; ".join(failures))
        return 1
    return 0


def render_heading(
    started: datetime,
    machine: dict[str, Any],
    command: str,
    *,
    a: Revision,
    b: Revision,
    differences: Sequence[str],
    n: object,
    args: argparse.Namespace,
) -> str:
    cpus = machine.get("cpus")
    load = machine.get("load_average")
    deps = "identical but for asyncq" if not differences else "DIFFERENT: " + "; ".join(differences)
    lines = [
        f"asyncq A/B, {started:%Y-%m-%d %H:%M} UTC"
        + (" — SMOKE RUN (--quick): the figures are not results" if args.quick else ""),
        f"machine: nproc {cpus}, {machine.get('cpu_model', '?')}, Linux {machine['kernel']}"
        + (f", load average {' '.join(str(x) for x in load)} at the start" if load else ""),
        *runner.pinned_lines(machine),
        f"Python {machine['python']}, redis-server {machine['redis_version']} over TCP,"
        f" N = {n}, {args.runs} round(s), "
        + ("each A then B" if args.order == "ab" else "A then B, then B then A, ...")
        + (f", variant {args.variant}" if args.variant and a.variant == b.variant else ""),
        f"A: {a.label}" + (f" = {a.commit}" if a.commit else ""),
        f"B: {b.label}" + (f" = {b.commit}" if b.commit else ""),
        f"dependencies of the two environments: {deps}",
        f"command: {command}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
