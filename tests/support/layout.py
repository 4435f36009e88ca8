"""Where a test file goes: the folder of the code it tests (docs/testing.md, Layout).

``python -m tests.support.layout`` places the test files left flat in ``tests/`` (written on
a branch older than the layout, or named before it): each one whose name says its folder is
moved there with ``git mv``, and in every file under ``tests/`` the imports of harnesses
that moved into ``tests/support/`` are rewritten to their new place. ``--dry-run`` prints
what it would do. A file it cannot place is listed, to be placed by hand (and a rule added
below); tests/project/test_layout.py fails while one is left.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

FOLDERS = {
    "worker": "the worker: asyncq/_worker, _service, _signals, _cancel, _batch",
    "broker": "the broker and its Lua scripts: asyncq/_broker",
    "producer": "the producer side: asyncq/_producer, asyncq/sync",
    # Not "redis": a script run from tests/ (the wheel smoke test) would import it as redis-py.
    "connection": "connections: asyncq/_redis (Cluster, Sentinel, TLS, transport, pools)",
    "scheduling": "asyncq/_scheduling: Scheduler, cron, periodic tasks, App.cron",
    "workflow": "workflows: chains, chords, handles, their scripts",
    "durable": "durable functions: asyncq/durable, App.durable, their scripts",
    "events": "the event stream and progress: asyncq/events, asyncq/progress",
    "inspection": "the Inspector and failure triage: asyncq/_inspection",
    "app": "the application surface: asyncq/app, task, mux, errors, hooks, otel",
    "web": "the web UI and its API: asyncq/web",
    "gateway": "the HTTP gateway: asyncq/gateway",
    "cli": "the command line: asyncq/cli (dash, supervisor)",
    "metrics": "asyncq/metrics and asyncq/history",
    "wire": "what Go asynq shares: _codec, proto, _keys, _gofmt, _duration, _time",
    "testing": "asyncq/testing and asyncq/devserver",
    "project": "README and docs snippets, examples, packaging",
    "bench": "the benchmark harness (benchmarks/, marker bench)",
    "chaos": "the chaos suite's own parts (chaos/)",
}
"""Each folder of tests/ that holds tests, and what it tests."""

RULES = (
    ("test_bench_", "bench"),
    ("test_chaos", "chaos"),
    ("test_workflow_web", "web"),
    ("test_web_", "web"),
    ("test_workflow", "workflow"),
    ("test_durable", "durable"),
    ("test_gateway", "gateway"),
    ("test_cli", "cli"),
    ("test_dash", "cli"),
    ("test_worker_supervisor", "cli"),
    ("test_metrics", "metrics"),
    ("test_history", "metrics"),
    ("test_inspector", "inspection"),
    ("test_triage", "inspection"),
    ("test_app_cron", "scheduling"),
    ("test_scheduler", "scheduling"),
    ("test_cron", "scheduling"),
    ("test_periodic", "scheduling"),
    ("test_events", "events"),
    ("test_progress", "events"),
    ("test_client", "producer"),
    ("test_task_owner", "producer"),
    ("test_producer", "producer"),
    ("test_sync_client", "producer"),
    ("test_delivery_processor", "worker"),
    ("test_delivery_doors", "worker"),
    ("test_attempt", "worker"),
    ("test_cancel", "worker"),
    ("test_forwarder", "worker"),
    ("test_reconnect", "worker"),
    ("test_asyncq_key", "inspection"),
    ("test_fuzz", "inspection"),
    ("test_dev_", "testing"),
    ("test_eager", "app"),
    ("test_delivery", "broker"),
    ("test_broker", "broker"),
    ("test_dequeue", "broker"),
    ("test_lua", "broker"),
    ("test_script", "broker"),
    ("test_connection", "connection"),
    ("test_transport", "connection"),
    ("test_cluster", "connection"),
    ("test_sentinel", "connection"),
    ("test_pools", "connection"),
    ("test_failover", "connection"),
    ("test_codec", "wire"),
    ("test_proto", "wire"),
    ("test_keys", "wire"),
    ("test_key_", "wire"),
    ("test_go_", "wire"),
    ("test_duration", "wire"),
    ("test_typed", "app"),
    ("test_typing", "app"),
    ("test_mux", "app"),
    ("test_app_", "app"),
    ("test_otel", "app"),
    ("test_error", "app"),
    ("test_processor", "worker"),
    ("test_roles", "worker"),
    ("test_worker", "worker"),
    ("test_server", "worker"),
    ("test_shutdown", "worker"),
    ("test_aggregator", "worker"),
    ("test_lease", "worker"),
    ("test_local_lease", "worker"),
    ("test_outcome", "worker"),
    ("test_devserver", "testing"),
    ("test_pytest_plugin", "testing"),
    ("test_docs", "project"),
    ("test_packaging", "project"),
)
"""A new file's folder by the start of its name; the first match wins. ``test_hostile_*``
and other names that say no room have no rule: they are placed by hand."""

MOVED = (
    # (old module, new module): the harnesses that moved into tests/support/.
    (r"tests\.workers\.support", "tests.support.procs"),
    (r"tests\.workers", "tests.support.workers"),
    (r"tests\.test_roles_fake_broker", "tests.support.roles"),
    (r"tests\.test_triage", "tests.support.triage"),
    (r"tests\.test_web_browser", "tests.support.browser"),
    (r"tests\.test_many_queues", "tests.support.helpers"),
    *(
        (rf"tests\.{name}", f"tests.support.{name}")
        for name in (
            "acl", "cluster", "fakebroker", "gateway_util", "gofixtures", "golden", "helpers",
            "progress_app", "redis_server", "resp_proxy", "transitions", "typed_app",
            "webdata", "wf_app",
        )
    ),
)  # fmt: skip
"""Only the names a test imported from another test file moved with it (roles: ``Q``,
``Running``, ``message``, ``role_deps``, ``Deferred``, the ``_returns``-like handlers;
triage: ``seed_mixed`` and the signatures; many_queues: ``push_go_task``). The browser
harness's helpers lost their underscore: ``new_page``, ``shot``, ``mutation``,
``require_browser``."""

_IMPORT_LINE = re.compile(r"^\s*(?:from|import)\s+tests\b.*$", re.MULTILINE)
_MODULE = re.compile(r"\b(?P<old>" + "|".join(old for old, _ in MOVED) + r")\b")
_FROM_TESTS = re.compile(r"^(?P<indent>\s*)from tests import (?P<name>\w+)")


def folder_for(name: str) -> str | None:
    """The folder a test file named *name* (``test_x.py``) goes in, or None."""
    for prefix, folder in RULES:
        if name.startswith(prefix):
            return folder
    return None


def flat_test_files() -> list[Path]:
    return sorted(TESTS.glob("test_*.py"))


def rewrite_imports(text: str) -> str:
    """*text* with the moved harnesses imported from their new places (import lines only:
    a module named in a string, ``"tests.typed_app:app"``, is left to the reader)."""
    new = {old.replace("\\", ""): new for old, new in MOVED}
    support = {m.removeprefix("tests.support.") for m in new.values()}

    def line(m: re.Match[str]) -> str:
        fixed = _MODULE.sub(lambda o: new[o.group("old")], m.group(0))
        bare = _FROM_TESTS.match(fixed)
        if bare and bare.group("name") in support:
            fixed = _FROM_TESTS.sub(r"\g<indent>from tests.support import \g<name>", fixed)
        return fixed

    return _IMPORT_LINE.sub(line, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.layout", description=__doc__)
    parser.add_argument("--dry-run", action="store_true", help="print, change nothing")
    args = parser.parse_args(argv)
    left = []
    for path in flat_test_files():
        folder = folder_for(path.name)
        twin = [p for p in TESTS.glob(f"*/{path.name}") if p.parent.name in FOLDERS]
        if twin:
            print(f"{path.name}: a copy of {twin[0].relative_to(TESTS.parent)}; merge by hand")
            left.append(path)
        elif folder is None:
            print(f"{path.name}: no rule says its folder; place it by hand (and add a rule)")
            left.append(path)
        else:
            print(f"{path.name} -> tests/{folder}/")
            if not args.dry_run:
                subprocess.run(
                    ["git", "mv", str(path), str(TESTS / folder / path.name)], check=True
                )
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        fixed = rewrite_imports(text)
        if fixed != text:
            print(f"imports rewritten: {path.relative_to(TESTS.parent)}")
            if not args.dry_run:
                path.write_text(fixed, encoding="utf-8")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
