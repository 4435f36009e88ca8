"""Every Python snippet in README.md and docs/*.md runs as written.

Each ```` ```python ```` block is saved as a file and run with this checkout on
the path, in a fresh directory, against a throwaway redis-server: the Redis
URLs the docs use (``redis://localhost:6379/0``, ``redis://127.0.0.1:6379/0``)
are pointed at it, and nothing else is changed. A marker on the line before
the fence changes how a block is run:

- ``<!-- snippet: serves (why) -->``: it serves until stopped (a worker, a
  scheduler); it must register itself in Redis, then exit 0 on SIGTERM.
- ``<!-- snippet: not-runnable (why) -->``: it is not run (it needs a
  third-party framework, say); the reason is required, and such blocks stay few.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis as sync_redis

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- snippet: (?P<mode>[a-z-]+)(?: \((?P<why>[^)]+)\))? -->$")
MODES = {"serves", "not-runnable"}
LOCAL_URLS = ("redis://localhost:6379/0", "redis://127.0.0.1:6379/0")
MAX_NOT_RUNNABLE = 3


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    code: str
    mode: str
    why: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def extract(path: Path) -> list[Snippet]:
    """The python blocks of *path*, with the marker before each (mode "run" without one)."""
    lines = path.read_text("utf-8").splitlines()
    snippets: list[Snippet] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        marker = MARKER.match(stripped)
        if stripped.startswith("<!-- snippet:"):
            assert marker, f"{path.name}:{i + 1}: malformed snippet marker {stripped!r}"
            assert marker["mode"] in MODES, f"{path.name}:{i + 1}: unknown mode {marker['mode']!r}"
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            where = f"{path.name}:{i + 1}"
            assert following == "```python", f"{where}: marker not before a python block"
        if stripped == "```python":
            start = i + 1
            end = start
            while lines[end].strip() != "```":
                end += 1
            previous = MARKER.match(lines[i - 1].strip()) if i > 0 else None
            mode = previous["mode"] if previous else "run"
            why = (previous["why"] or "") if previous else ""
            code = "\n".join(lines[start:end]) + "\n"
            snippets.append(Snippet(path, start, code, mode, why))
            i = end
        i += 1
    return snippets


SNIPPETS = [s for path in SOURCES for s in extract(path)]


def test_snippets_are_found_and_few_are_exempt() -> None:
    assert any(s.path.name == "README.md" for s in SNIPPETS)
    assert len(SNIPPETS) >= 10
    exempt = [s for s in SNIPPETS if s.mode == "not-runnable"]
    assert len(exempt) <= MAX_NOT_RUNNABLE, [s.id for s in exempt]
    for s in exempt:
        assert s.why.strip(), f"{s.id}: a not-runnable snippet must say why"


def prepare(snippet: Snippet, redis_url: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    code = snippet.code
    for url in LOCAL_URLS:
        code = code.replace(url, redis_url)
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASYNCQ_REDIS_URL": redis_url}
    return script, env


@pytest.mark.slow
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs_as_written(snippet: Snippet, redis_url: str, tmp_path: Path) -> None:
    if snippet.mode == "not-runnable":
        pytest.skip(f"marked not runnable: {snippet.why}")
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    script, env = prepare(snippet, redis_url, tmp_path)
    try:
        if snippet.mode == "run":
            result = subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
            assert result.returncode == 0, f"{snippet.id}\n{snippet.code}\n{result.stderr}"
            assert "Traceback" not in result.stderr, result.stderr
            return
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not (r.zcard("asynq:servers") or r.zcard("asynq:schedulers")):
                if proc.poll() is not None:
                    pytest.fail(f"{snippet.id} exited ({proc.returncode}): {proc.communicate()}")
                assert time.monotonic() < deadline, f"{snippet.id} never started serving"
                time.sleep(0.05)
            # Registered means started: Server.run and Scheduler.run install their
            # handlers before they register (Service._run_until_signal).
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, f"{snippet.id}: exit {proc.returncode}\n{err}"
        assert "Traceback" not in err, err
    finally:
        r.close()
