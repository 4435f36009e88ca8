"""The pytest side of the Lua mutation run: every mutant of one script in one pytest process.

``tests/mutation/lua.py`` starts ``pytest -p tests.mutation.runner`` with
``ASYNCQ_MUTATION_SPEC`` naming a JSON file (the script's name, its mutants, where
to write the outcomes). This plugin replaces the test loop: it runs the collected
tests once on the unmutated script, then for each mutant swaps it into every loaded
:class:`~asyncq._redis.scripts.Script` whose source holds the script (the broker's
module-level scripts and the ones composed of several files), runs the tests until
the first failure and swaps the script back. Starting pytest, importing the package
and collecting the tests once per script instead of once per mutant is most of the
time a run takes.

The file on disk is never written, so runs of several scripts may go side by side;
the scripts this process loads are pinned to git's committed copy. The tests run are
the ones not marked slow, none of which starts a process that would read the file.

The tests that killed earlier mutants run first: a mutant is usually killed by a
test that killed one of its neighbours, so a killed mutant costs a few tests and a
survivor the whole selection. One outcome per line goes to the results file as it
comes, so the parent reports what finished even when the run is interrupted.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from _pytest.runner import runtestprotocol
from pytest_timeout import _get_item_settings  # type: ignore[import-untyped]

from asyncq._broker._base import LUA_PACKAGE
from asyncq._redis.scripts import Script, expand_includes, load_script
from tests.support.redis_server import RedisServer

SPEC = "ASYNCQ_MUTATION_SPEC"
ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "asyncq" / "_broker" / "lua"


# A failure whose exception (its type and message) holds one of these is a wait that
# ran out, which load alone can cause: pytest-timeout's limit, wait_until's deadline, a
# client's timeout, a script stopped by Redis' Lua time limit (BUSY).
TIMEOUT_MARKS = (
    "Failed: Timeout",
    "timed out after",
    "TimeoutError",
    "Timeout reading from",
    "Timeout connecting",
    "BusyScriptError",
    "BUSY Redis is busy",
)


def _message(report: pytest.TestReport) -> str:
    """The failure's one-line summary (its exception and message)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else report.longreprtext.strip().splitlines()[-1:]
    if isinstance(text, list):
        text = text[0] if text else ""
    return " ".join(str(text).split())


def committed(script: str) -> str:
    """The script as git's HEAD has it."""
    rel = (LUA / f"{script}.lua").relative_to(ROOT).as_posix()
    return subprocess.run(
        ["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def as_run(script: str, text: str) -> str:
    """*text* (the file ``script.lua`` or a mutant of it) as Redis runs it: its
    ``-- include:`` lines expanded, since the loaded scripts hold the expanded text."""
    return expand_includes(text, f"lua/{script}.lua", LUA / "_lib")


def _swap(old: str, new: str) -> int:
    """Put *new* in place of *old* in every loaded script's source; how many changed."""
    # A started Server froze the heap (gc.freeze, asyncq._worker.server), and frozen
    # objects are not in gc.get_objects(): thaw them, or no script is found after the
    # baseline run of a test that starts a server.
    gc.unfreeze()
    changed = 0
    for obj in gc.get_objects():
        if isinstance(obj, Script) and old in obj.source:
            obj.__init__(  # type: ignore[misc]
                obj.name, obj.source.replace(old, new), allow_oom=obj.flagged_source is not None
            )
            changed += 1
    return changed


def _pin_to_git() -> None:
    """Load every script and make it git's copy (a file may differ on disk while the
    package is edited); composed scripts hold the same text, so they follow."""
    for path in sorted(LUA.glob("*.lua")):
        loaded = load_script(LUA_PACKAGE, path.stem).source
        text = as_run(path.stem, committed(path.stem))
        if loaded != text:
            _swap(loaded, text)


class _Loop:
    def __init__(self, session: pytest.Session, spec: dict[str, Any], server: RedisServer) -> None:
        self.session = session
        self.items: list[pytest.Item] = list(session.items)
        self.script: str = spec["script"]
        self.original = as_run(self.script, committed(self.script))
        self.mutants: list[dict[str, Any]] = spec["mutants"]
        self.out = Path(spec["results"])
        self.server = server
        self.killers: list[pytest.Item] = []
        self._mutant = self.original

    def _order(self) -> list[pytest.Item]:
        first = [i for i in reversed(self.killers)]
        return first + [i for i in self.items if i not in first]

    def _run(self, order: list[pytest.Item]) -> tuple[pytest.Item, str, str] | None:
        """Run *order* until a test fails: (the failing test, "error" or "timeout", the
        failure's message), or None when every test passes."""
        for n, item in enumerate(order):
            # The last test (or a failing one) tears everything down: the next run may
            # start with the same test, which must not find its own fixtures still set up.
            nextitem = order[n + 1] if n + 1 < len(order) else None
            reports = self._protocol(item, nextitem)
            failed = [r for r in reports if r.failed]
            if failed:
                if nextitem is not None:
                    self.session._setupstate.teardown_exact(None)
                message = _message(failed[0])
                kind = "timeout" if any(mark in message for mark in TIMEOUT_MARKS) else "error"
                return item, kind, message[:300]
        return None

    @staticmethod
    def _protocol(item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.TestReport]:
        """One test's setup, call and teardown, under pytest-timeout's limit.

        pytest-timeout sets its timer in the pytest_runtest_protocol hook, which
        runtestprotocol does not go through: without this a mutant that makes a test
        loop for ever (a reply that always asks again) would stop the run.
        """
        settings = _get_item_settings(item)
        timed = bool(settings.timeout) and settings.timeout > 0 and not settings.func_only
        hooks = item.config.pluginmanager.hook
        if timed:
            hooks.pytest_timeout_set_timer(item=item, settings=settings)
        try:
            return runtestprotocol(item, log=False, nextitem=nextitem)
        finally:
            if timed:
                hooks.pytest_timeout_cancel_timer(item=item)

    def _passes_unmutated(self, item: pytest.Item) -> bool:
        """Whether *item* passes on the unmutated script (its failure was the mutant's)."""
        self._heal_server()
        return self._run([item]) is None

    def _judge(self) -> tuple[str, pytest.Item | None, str]:
        """Run the tests against the swapped-in mutant: (outcome, killer, message).

        Load must not make a kill. A failure is a kill only when the same test then
        passes on the unmutated script. After a failure that is a wait running out
        (the test's timeout, a ``wait_until`` deadline, a client or Lua time limit)
        the other tests run: one failing on an assertion or an error makes it a kill;
        else the test that ran out runs again, and running out again (while it passes
        unmutated) makes it a ``timeout`` (the mutant hangs or stalls the task). It is
        ``undecided`` when the failing test fails unmutated as well (the machine was
        too slow to judge).
        """
        found = self._run(self._order())
        if found is None:
            return "survived", None, ""
        item, kind, message = found
        if kind == "timeout":
            # The other tests first: one failing on an assertion is a better witness.
            self._heal_server()
            other = self._run([i for i in self._order() if i is not item])
            if other is not None and other[1] == "error":
                item, kind, message = other
            else:
                self._heal_server()
                again = self._run([item])
                if again is None and other is not None:
                    self._heal_server()
                    again = self._run([other[0]])
                if again is None:
                    return "survived", None, ""
                item, kind, message = again
        swapped_in = self._mutant
        _swap(swapped_in, self.original)
        try:
            clean = self._passes_unmutated(item)
        finally:
            _swap(self.original, swapped_in)
        if not clean:
            return "undecided", item, f"fails unmutated too: {message}"
        return ("timeout" if kind == "timeout" else "killed"), item, message

    def _heal_server(self) -> None:
        """A mutant may leave a script running forever (Redis answers BUSY to everyone)."""
        client = sync_redis.Redis.from_url(self.server.url, socket_timeout=5)
        try:
            try:
                client.ping()
                return
            except sync_redis.exceptions.BusyLoadingError:
                pass
            except sync_redis.exceptions.ResponseError:
                pass
            try:
                client.script_kill()
                client.ping()
                return
            except sync_redis.exceptions.RedisError:
                pass
        finally:
            client.close()
        self.server.restart()

    def _write(self, record: dict[str, Any]) -> None:
        with self.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def run(self) -> None:
        failed = self._run(self.items)
        if failed is not None:
            self._write({"baseline": "failed", "test": failed[0].nodeid, "message": failed[2]})
            return
        self._write({"baseline": "passed", "tests": len(self.items)})
        for n, mutant in enumerate(self.mutants):
            source = as_run(self.script, mutant["source"])
            started = time.monotonic()
            swapped = _swap(self.original, source)
            self._mutant = source
            try:
                outcome, killer, message = self._judge()
            finally:
                _swap(source, self.original)
            if killer is not None:
                if killer in self.killers:
                    self.killers.remove(killer)
                self.killers.append(killer)
            self._heal_server()
            self._write(
                {
                    "index": n,
                    "outcome": outcome,
                    "killer": None if killer is None else killer.nodeid,
                    "message": message,
                    "scripts": swapped,
                    "seconds": time.monotonic() - started,
                }
            )


_server: RedisServer | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _server
    if os.environ.get(SPEC):
        # The tests' own server, so that a mutant's endless script can be killed.
        server = RedisServer()
        server.start()
        _server = server
        os.environ["ASYNCQ_TEST_REDIS_URL"] = server.url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        _server.cleanup()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    spec_path = os.environ.get(SPEC)
    if not spec_path or _server is None:
        return None
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    _pin_to_git()
    _Loop(session, spec, _server).run()
    session._setupstate.teardown_exact(None)
    return True
