"""A newcomer's first try, from README and docs (issue 23's list): each fix has a check here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import redis as sync_redis
from click.testing import CliRunner

from asyncq.cli import main
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_no_page_installs_asyncq_from_an_index_it_is_not_on() -> None:
    # asyncq is not on PyPI: `pip install asyncq` fails. Extras of an installed asyncq
    # (`pip install 'asyncq[web]'`) work, so only the bare package name is refused.
    bare = re.compile(r"pip install (?:-[-\w]+ )*['\"]?asyncq(?:==[\w.]+)?['\"]?(?:\s|$)")
    found = [
        f"{p.name}:{n}: {line.strip()}"
        for p in DOCS
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert found == []


def _readme_block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


def test_the_typed_tasks_snippet_saved_as_tasks_py_imports_without_running(
    tmp_path: Path,
) -> None:
    # `asyncq worker tasks:app` imports tasks.py: the demo must not run (nor connect).
    code = _readme_block_after("## Typed tasks")
    assert code.startswith("# tasks.py\n")
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    (tmp_path / "tasks.py").write_text(code.replace("redis://localhost:6379/0", unreachable))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", "import tasks; print(type(tasks.app).__name__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "App\n"


def test_limit_and_ordered_are_stored_for_a_queue_with_no_task_yet(redis_url: str) -> None:
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    runner = CliRunner()
    limited = runner.invoke(main, ["-u", redis_url, "queue", "limit", "fresh", "3"])
    assert limited.exit_code == 0, limited.output
    assert limited.output == (
        'Limited queue "fresh" to 3 running tasks fleet-wide '
        "(the queue has no task yet: the setting applies when its tasks come)\n"
    )
    shown = runner.invoke(main, ["-u", redis_url, "queue", "limit", "fresh"])
    assert shown.output == 'Queue "fresh": at most 3 running tasks fleet-wide\n'
    ordered = runner.invoke(main, ["-u", redis_url, "queue", "ordered", "fresh", "on"])
    assert ordered.exit_code == 0, ordered.output
    assert runner.invoke(main, ["-u", redis_url, "queue", "ordered", "fresh"]).output == (
        'Queue "fresh" is ordered\n'
    )
    r.close()


def test_pytest_examples_testing_runs_as_the_readme_says() -> None:
    # The repository's own `-p no:asyncq` must not reach the example (its own pytest.ini).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "examples/testing", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"^3 passed", result.stdout.splitlines()[-1]), result.stdout[-500:]


def test_docs_index_lists_every_guide_and_quotes_readmes_speed() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    for page in ("typed-api", "workflows", "flow-control", "web", "gateway", "testing"):
        assert f"({page}.md)" in index, page
    # README's speed claim, word for word (its link aside), dated: one text in both places
    readme = " ".join((ROOT / "README.md").read_text().split())
    claim = re.search(r"- Idle workers pick up a new task in .*? see \[Benchmarks\]", readme)
    assert claim is not None and re.search(r"20\d\d-\d\d-\d\d", claim.group())
    assert claim.group() in " ".join(index.split())


async def test_dash_lists_other_states_after_visiting_a_group(redis_url: str) -> None:
    # The aggregation group picked on the aggregating tab was passed to every state:
    # archived and completed then showed "0 shown".
    from datetime import UTC, datetime, timedelta

    from redis.asyncio import Redis
    from textual.widgets import DataTable, Static

    from asyncq.cli.dash import DashApp, QueueScreen, QueuesScreen
    from tests.support import gofixtures as go

    now = datetime.now(UTC).replace(microsecond=0)
    r = Redis.from_url(redis_url)
    await r.flushdb()
    await go.add_to_group(r, go.GoTask("notify", group_key="user-1"), now)
    archived = [go.GoTask("old", b"1"), go.GoTask("old", b"2")]
    for t in archived:
        await go.seed_archived(r, t, now - timedelta(hours=1))
    await r.aclose()

    def rows(app: DashApp) -> list[str]:
        return [str(k.value) for k in app.screen.query_one("#tasks", DataTable).rows]

    def status(app: DashApp) -> str:
        return str(app.screen.query_one("#status", Static).render())

    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=(160, 40)) as pilot:

        async def until(cond: object, what: str) -> None:
            assert callable(cond)
            for _ in range(400):
                if cond():
                    return
                await pilot.pause(0.02)
            raise AssertionError(f"timed out waiting for {what}: {status(app)!r} {rows(app)}")

        await until(lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        await pilot.press("enter")
        await until(lambda: isinstance(app.screen, QueueScreen), "the queue screen")

        async def tab(state: str) -> None:
            # The screen opens on the first state that has tasks; step right to *state*.
            for _ in range(8):
                if status(app).startswith(f"{state} tasks"):
                    return
                await pilot.press("right")
                await pilot.pause(0.1)
            raise AssertionError(f"no {state} tab: {status(app)!r}")

        await until(lambda: status(app).endswith(")") or "group" in status(app), "a tab")
        await tab("aggregating")
        await until(lambda: "group user-1" in status(app), "the group")
        assert len(rows(app)) == 1
        await tab("archived")
        await until(lambda: len(rows(app)) == 2, "the archived tasks")
        assert sorted(rows(app)) == sorted(t.id for t in archived)
        assert "group" not in status(app) and "(2 shown)" in status(app)
        await pilot.press("q", "q")


def _side_by_side(
    *runs: tuple[list[str], dict[str, str] | None],
) -> list[subprocess.CompletedProcess[str]]:
    """Run each (argv, env) at once, not one after another (each is mostly Python start-up
    or waiting); their outcomes in order."""
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for argv, env in runs
    ]
    try:
        outs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return [
        subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        for proc, (out, err) in zip(procs, outs, strict=True)
    ]


def test_web_and_gateway_on_a_busy_port_fail_in_one_line_without_claiming_to_serve(
    redis_url: str,
) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        commands = (["web"], ["gateway"])
        cli = [sys.executable, "-m", "asyncq.cli", "-u", redis_url]
        results = _side_by_side(
            *(([*cli, *command, "--port", str(port)], None) for command in commands)
        )
        for command, result in zip(commands, results, strict=True):
            assert result.returncode == 1, (command, result.stderr)
            lines = result.stderr.splitlines()
            assert len(lines) == 1, (command, result.stderr)
            assert lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port}: "), lines
            assert "choose one with --port N" in lines[0]


# A one-second retry deadline instead of the default five: the first retry (the line
# the loud run must log) follows the first failure at once, whatever the deadline.
FAILED_ENQUEUE = """
import asyncio
from datetime import timedelta
from asyncq import Client, Task, EnqueueRetryError, RetryPolicy
async def main():
    retry = RetryPolicy(deadline=timedelta(seconds=1))
    async with Client("redis://127.0.0.1:{port}/0", retry=retry) as client:
        try:
            await client.enqueue(Task("t", b"x"))
        except EnqueueRetryError:
            print("caught")
asyncio.run(main())
"""


def test_an_application_that_configured_no_logging_gets_no_debug_lines() -> None:
    script = FAILED_ENQUEUE.replace("{port}", str(free_port()))
    env = {k: v for k, v in os.environ.items() if k != "ASYNCQ_LOG_LEVEL"}
    # Unconfigured, and asked for (ASYNCQ_LOG_LEVEL=debug).
    quiet, loud = _side_by_side(
        ([sys.executable, "-c", script], env),
        ([sys.executable, "-c", script], {**env, "ASYNCQ_LOG_LEVEL": "debug"}),
    )
    assert (quiet.stdout, quiet.stderr) == ("caught\n", "")
    # Asked for: on stderr, UTC ISO stamps like the CLI, no colours in a file.
    assert loud.stdout == "caught\n"
    lines = loud.stderr.splitlines()
    assert lines and all("enqueue failed; retrying" in line for line in lines), lines
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z ", line) for line in lines), lines
    assert "\x1b[" not in loud.stderr


def test_a_bad_uri_is_named_once() -> None:
    result = CliRunner().invoke(main, ["-u", "garbage", "stats"])
    assert result.exit_code == 1
    assert result.output == "error: invalid Redis URI 'garbage': expected <scheme>://...\n"


def test_every_example_reads_asyncq_redis_url_and_nothing_else() -> None:
    for path in sorted((ROOT / "examples").rglob("*.py")):
        text = path.read_text()
        # Neither read in code nor set in the docstring's commands.
        assert not re.search(r"environ(?:\.get\(|\[)\s*['\"]REDIS_URL['\"]", text), path
        assert not re.search(r"(?<![A-Z_])REDIS_URL=redis://", text), path


def test_supervised_workers_that_cannot_reach_redis_are_not_restarted_forever(
    tmp_path: Path,
) -> None:
    (tmp_path / "noopapp.py").write_text("from asyncq import ServeMux\nmux = ServeMux()\n")
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [sys.executable, "-m", "asyncq.cli", "-u", url, "worker", "noopapp:mux", "--processes=2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"error: the worker processes cannot connect to Redis at {url} (log above)"
    )
    assert "restarting it" not in result.stderr


def test_the_timeline_counts_the_failed_attempt() -> None:
    from datetime import UTC, datetime, timedelta

    from asyncq.task import TaskInfo, TaskState
    from asyncq.web._render import task_timeline

    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)

    def info(state: TaskState, retried: int, max_retry: int) -> TaskInfo:
        return TaskInfo(
            id="t", queue="q", type="x", payload=b"", state=state, max_retry=max_retry,
            retried=retried, last_error="boom", last_failed_at=now - timedelta(minutes=1),
            timeout=None, deadline=None, group="", next_process_at=None, retention=None,
            completed_at=None, result=None,
        )  # fmt: skip

    def failed(task: TaskInfo) -> str:
        (label,) = [text for _, text in task_timeline(task, now) if text.startswith("failed")]
        return label

    # max_retry=0: the one attempt failed and archived the task (was "attempt 0 of 1").
    assert failed(info(TaskState.ARCHIVED, 0, 0)) == "failed (attempt 1 of 1)"
    # Every retry used, then the last attempt archived it.
    assert failed(info(TaskState.ARCHIVED, 3, 3)) == "failed (attempt 4 of 4)"
    # The first attempt failed and the task waits for its retry.
    assert failed(info(TaskState.RETRY, 1, 3)) == "failed (attempt 1 of 4)"


def test_a_workflow_without_retention_says_so(redis_url: str) -> None:
    import asyncio
    from datetime import timedelta

    from asyncq import Client, Task, chain

    async def start() -> tuple[str, str]:
        async with Client(redis_url) as client:
            plain = await chain(Task("a"), Task("b")).enqueue(client)
            b = Task("b", retention=timedelta(hours=2))
            kept = await chain(Task("a"), b).enqueue(client)
        return plain.id, kept.id

    plain_id, kept_id = asyncio.run(start())
    runner = CliRunner()

    def retention_line(workflow_id: str) -> str:
        args = ["-u", redis_url, "workflow", "inspect", "-q", "default", "-i", workflow_id]
        out = runner.invoke(main, args).output
        (line,) = [x for x in out.splitlines() if x.startswith("Retention:")]
        return line

    assert retention_line(plain_id) == "Retention:  none (deleted when it finishes)"
    assert retention_line(kept_id) == "Retention:  2h"


async def test_the_workflow_page_says_when_there_is_no_retention(redis_url: str) -> None:
    import httpx
    from redis.asyncio import Redis

    from asyncq import Client, Task, chain
    from asyncq.web import create_app

    r = Redis.from_url(redis_url)
    await r.flushdb()
    await r.aclose()
    async with Client(redis_url) as client:
        info = await chain(Task("a"), Task("b")).enqueue(client)
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as http,
    ):
        page = await http.get(f"/queues/default/workflows/{info.id}")
    assert page.status_code == 200, page.text[:500]
    assert "<th>Retention</th><td>none (deleted when it finishes)</td>" in page.text
    assert "0:00:00" not in page.text


async def test_the_web_ui_has_a_favicon(redis_url: str) -> None:
    import httpx

    from asyncq.web import create_app

    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as http,
    ):
        icon = await http.get("/favicon.ico", follow_redirects=True)
        page = await http.get("/")
    assert icon.status_code == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg")
    assert '<link rel="icon" href="/static/favicon.svg"' in page.text


async def test_the_task_page_links_its_workflow(redis_url: str) -> None:
    import httpx

    from asyncq import Client, Task, chain
    from asyncq.web import create_app

    async with Client(redis_url) as client:
        info = await chain(Task("a"), Task("b")).enqueue(client)
    first = info.stages[0][0].id
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as http,
    ):
        page = await http.get(f"/queues/default/tasks/{first}")
    assert page.status_code == 200, page.text[:300]
    link = f'<a href="/queues/default/workflows/{info.id}"><code>{info.id}</code></a>'
    assert link in page.text
