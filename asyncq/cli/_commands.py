"""The inspection and management commands: stats, queue, task, group, server, cron."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click
from redis.exceptions import ResponseError

from asyncq._duration import format_short, parse_cli_duration
from asyncq._inspection.inspector import Inspector
from asyncq._inspection.records import ARCHIVE_LIMIT, ArchiveReport, QueueInfo, ServerInfo
from asyncq._redis.scripts import parse_server_version
from asyncq.cli._app import CliError, run_async, settings
from asyncq.cli._extras import require_extra
from asyncq.cli._format import (
    bar_chart,
    format_bytes,
    format_payload,
    format_time,
    parse_time,
    relative,
    table,
    task_rows,
    task_text,
    to_json,
)
from asyncq.errors import AsyncqError
from asyncq.task import TaskInfo, TaskState

__all__ = ["given_id", "lookup_options", "register"]

T = TypeVar("T")

STATES = [s.value for s in TaskState]
MAX_DAYS = 3650
"""Longest ``--days`` (asynq keeps daily counters for 90 days; older days read as zero)."""
MAX_PAGE = 1_000_000
MAX_PAGE_SIZE = 10_000
"""Bounds that keep page * size inside Redis' integer range."""
ARCHIVE_ALL_STATES = ["pending", "aggregating", "scheduled", "retry"]
DELETE_ALL_STATES = ["pending", "aggregating", "scheduled", "retry", "archived", "completed"]
RUN_ALL_STATES = ["scheduled", "retry", "archived", "aggregating"]


def with_inspector(ctx: click.Context, fn: Callable[[Inspector], Awaitable[T]]) -> T:
    """Run *fn* with an Inspector on the configured Redis."""
    uri = settings(ctx).uri()

    async def go() -> T:
        async with Inspector(uri) as inspector:
            return await fn(inspector)

    return run_async(uri, go)


async def each(
    items: Sequence[str], fn: Callable[[str], Awaitable[T]]
) -> list[tuple[str, T | None, str | None]]:
    """Apply *fn* to every item; per-item asyncq errors are collected, not raised."""
    out: list[tuple[str, T | None, str | None]] = []
    for item in items:
        try:
            out.append((item, await fn(item), None))
        except (AsyncqError, ValueError) as exc:
            out.append((item, None, str(exc)))
    return out


def report_errors(results: Sequence[tuple[str, Any, str | None]]) -> None:
    """Print one ``error:`` line per failed item and exit 1 if there was any."""
    failed = [err for _, _, err in results if err is not None]
    for err in failed:
        click.echo(f"error: {' '.join(err.split())}", err=True)
    if failed:
        raise click.exceptions.Exit(1)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


def queue_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--queue", "-q", required=True, help="Queue name.")(fn)


def id_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--id", "-i", "task_id", required=True, help="Task ID.")(fn)


def group_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--group", "-g", help="Group name (required for aggregating).")(fn)


if TYPE_CHECKING:  # click >= 8.2 types ParamType by its value; older clicks are not generic
    _DurationParam = click.ParamType[timedelta, Any]
    _TimeParam = click.ParamType[datetime, Any]
else:
    _DurationParam = _TimeParam = click.ParamType


class DurationType(_DurationParam):
    """A Go-style duration: 30s, 5m, 1h30m, 500ms."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_cli_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class TimeType(_TimeParam):
    """An RFC 3339 time with offset: 2024-05-01T12:00:00Z."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, datetime):
            return value
        try:
            return parse_time(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
TIME = TimeType()


def state_choice(states: Sequence[str]) -> click.Choice[str]:
    return click.Choice(list(states), case_sensitive=False)


def error_rate(processed: int, failed: int) -> str:
    return "N/A" if processed == 0 else f"{failed / processed * 100:.2f}%"


# -- stats ------------------------------------------------------------------------------------


def _redis_summary(info: dict[str, Any]) -> dict[str, Any]:
    if "redis_version" not in info:
        # A cluster client answers per node; show the first node.
        for value in info.values():
            if isinstance(value, dict) and "redis_version" in value:
                info = value
                break
    uptime = info.get("uptime_in_days")
    # The server's own name and version: Valkey's redis_version is a compatibility number.
    server, version = parse_server_version(info)
    return {
        "server": server,
        "version": version or "?",
        "uptime": f"{uptime} day{'s' if uptime != 1 else ''}" if uptime is not None else "?",
        "connections": info.get("connected_clients", "?"),
        "memory_usage": info.get("used_memory_human", "?"),
        "peak_memory_usage": info.get("used_memory_peak_human", "?"),
    }


@click.command(short_help="Task counts by state and queue, daily stats, Redis info.")
@json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Task counts by state and queue, today's totals and Redis information."""

    async def go(insp: Inspector) -> tuple[list[QueueInfo], dict[str, Any] | str]:
        infos: list[QueueInfo] = []
        for name in await insp.queues():
            try:
                infos.append(await insp.queue_info(name))
            except AsyncqError:
                continue  # removed between the two calls
        try:
            return infos, await insp.redis_info()
        except ResponseError as exc:  # an ACL user without INFO: the counts still stand
            return infos, str(exc)

    infos, info = with_inspector(ctx, go)
    states = ["active", "pending", "aggregating", "scheduled", "retry", "archived", "completed"]
    by_state = {s: sum(getattr(q, s) for q in infos) for s in states}
    processed = sum(q.processed for q in infos)
    failed = sum(q.failed for q in infos)
    redis = _redis_summary(info) if isinstance(info, dict) else None
    if isinstance(info, str):
        click.echo(
            f"warning: Redis Info left out: Redis refused the INFO command ({info})", err=True
        )
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    if as_json:
        click.echo(
            to_json(
                {
                    "by_state": by_state,
                    "by_queue": {q.queue: q.size for q in infos},
                    "daily": {"date": today, "processed": processed, "failed": failed},
                    "queues": infos,
                    "redis": redis,
                }
            )
        )
        return
    click.echo("Task Count by State")
    click.echo(bar_chart(list(by_state.items())))
    click.echo()
    click.echo("Task Count by Queue")
    click.echo(bar_chart([(q.queue, q.size) for q in infos]) if infos else "No queues")
    click.echo()
    click.echo(f"Daily Stats {today} UTC")
    click.echo(
        table(
            ["processed", "failed", "error rate"],
            [[str(processed), str(failed), error_rate(processed, failed)]],
        )
    )
    if redis is None:
        return
    click.echo()
    click.echo("Redis Info")
    click.echo(
        table(
            ["server", "version", "uptime", "connections", "memory usage", "peak memory usage"],
            [[str(v) for v in redis.values()]],
        )
    )


# -- queue ------------------------------------------------------------------------------------


@click.group()
def queue() -> None:
    """Inspect, pause, resume and remove queues."""


@queue.command("ls")
@click.option("--cluster", is_flag=True, help="Also show each queue's key slot and nodes.")
@json_option
@click.pass_context
def queue_ls(ctx: click.Context, cluster: bool, as_json: bool) -> None:
    """List queues."""

    async def go(insp: Inspector) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for name in await insp.queues():
            row: dict[str, Any] = {"queue": name}
            if cluster:
                row["key_slot"] = await insp.cluster_key_slot(name)
                row["nodes"] = [n.addr for n in await insp.cluster_nodes(name)]
            rows.append(row)
        return rows

    rows = with_inspector(ctx, go)
    if as_json:
        click.echo(to_json(rows if cluster else [r["queue"] for r in rows]))
    elif cluster:
        lines = [[r["queue"], str(r["key_slot"]), ", ".join(r["nodes"])] for r in rows]
        click.echo(table(["Queue", "KeySlot", "Nodes"], lines))
    else:
        for r in rows:
            click.echo(r["queue"])


def _queue_text(q: QueueInfo) -> str:
    states = ["active", "pending", "aggregating", "scheduled", "retry", "archived", "completed"]
    lines = [
        f"Queue: {q.queue}",
        f"Size: {q.size}    Groups: {q.groups}    Latency: {format_short(q.latency)}    "
        f"Memory usage: {format_bytes(q.memory_usage)}    Paused: {'yes' if q.paused else 'no'}",
        "",
        table(states, [[str(getattr(q, s)) for s in states]]),
        "",
        f"Today ({q.timestamp.astimezone(UTC):%Y-%m-%d} UTC): processed {q.processed}, "
        f"failed {q.failed}, error rate {error_rate(q.processed, q.failed)}",
        f"All time: processed {q.processed_total}, failed {q.failed_total}",
    ]
    if q.concurrency_limit is not None:
        lines.append(
            f"Limit: {q.concurrency_limit} running fleet-wide    Running: {q.running}    "
            f"Held back by the limit: {q.held_back}"
        )
    if q.ordered:
        lines.append("Ordered: yes (one task at a time fleet-wide, failed task first)")
    if q.rate_limit is not None:
        tokens = "-" if q.rate_tokens is None else q.rate_tokens
        lines.append(f"Rate limit: {q.rate_limit}    Tokens now: {tokens}")
    if q.configured_text:
        lines.append(f"Configured by live servers: {q.configured_text}")
    return "\n".join(lines)


@queue.command("inspect")
@click.argument("queues", nargs=-1, required=True)
@json_option
@click.pass_context
def queue_inspect(ctx: click.Context, queues: tuple[str, ...], as_json: bool) -> None:
    """Show sizes by state, counters, latency and memory of QUEUES."""
    results = with_inspector(ctx, lambda insp: each(queues, insp.queue_info))
    good = [info for _, info, _ in results if info is not None]
    if as_json:
        click.echo(to_json(good))
    elif good:
        click.echo("\n\n".join(_queue_text(q) for q in good))
    report_errors(results)


@queue.command("history")
@click.argument("queues", nargs=-1, required=True)
@click.option(
    "--days",
    "-x",
    type=click.IntRange(min=1, max=MAX_DAYS),
    default=10,
    show_default=True,
    help="Days.",
)
@json_option
@click.pass_context
def queue_history(ctx: click.Context, queues: tuple[str, ...], days: int, as_json: bool) -> None:
    """Daily processed and failed counts of QUEUES, today first."""
    results = with_inspector(ctx, lambda insp: each(queues, lambda q: insp.history(q, days)))
    good = [(name, rows) for name, rows, _ in results if rows is not None]
    if as_json:
        click.echo(to_json({name: rows for name, rows in good}))
    else:
        blocks = []
        for name, rows in good:
            body = table(
                ["Date (UTC)", "Processed", "Failed", "Error Rate"],
                [
                    [s.date.isoformat(), str(s.processed), str(s.failed),
                     error_rate(s.processed, s.failed)]
                    for s in rows
                ],
            )  # fmt: skip
            blocks.append(f"Queue: {name}\n\n{body}")
        if blocks:
            click.echo("\n\n".join(blocks))
    report_errors(results)


def _queue_action(
    ctx: click.Context,
    queues: Sequence[str],
    action: Callable[[Inspector, str], Awaitable[None]],
    done: str,
) -> None:
    results = with_inspector(ctx, lambda insp: each(queues, lambda q: action(insp, q)))
    for name, _, err in results:
        if err is None:
            click.echo(f'{done} queue "{name}"')
    report_errors(results)


@queue.command("pause")
@click.argument("queues", nargs=-1, required=True)
@click.pass_context
def queue_pause(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Pause QUEUES: workers stop taking their tasks."""
    _queue_action(ctx, queues, lambda insp, q: insp.pause(q), "Paused")


@queue.command("resume")
@click.argument("queues", nargs=-1, required=True)
@click.pass_context
def queue_resume(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Resume paused QUEUES."""
    _queue_action(ctx, queues, lambda insp, q: insp.resume(q), "Resumed")


@queue.command("rm")
@click.argument("queues", nargs=-1, required=True)
@click.option("--force", "-f", is_flag=True, help="Also delete the tasks (none may be active).")
@click.pass_context
def queue_rm(ctx: click.Context, queues: tuple[str, ...], force: bool) -> None:
    """Remove QUEUES (they must be empty unless --force)."""
    _queue_action(ctx, queues, lambda insp, q: insp.delete_queue(q, force=force), "Removed")


# -- task -------------------------------------------------------------------------------------


@click.group()
def task() -> None:
    """List, inspect, enqueue, run, archive, delete and cancel tasks."""


@task.command("ls")
@queue_option
@click.option("--state", "-s", required=True, type=state_choice(STATES), help="Task state.")
@click.option(
    "--page", type=click.IntRange(min=1, max=MAX_PAGE), default=1, show_default=True, help="Page."
)
@click.option(
    "--size",
    type=click.IntRange(min=1, max=MAX_PAGE_SIZE),
    default=30,
    show_default=True,
    help="Page size.",
)
@group_option
@json_option
@click.pass_context
def task_ls(
    ctx: click.Context,
    *,
    queue: str,
    state: str,
    page: int,
    size: int,
    group: str | None,
    as_json: bool,
) -> None:
    """List one page of a queue's tasks in a state."""
    st = TaskState(state.lower())
    if st is TaskState.AGGREGATING and not group:
        raise click.UsageError("--group is required with --state aggregating")
    if st is not TaskState.AGGREGATING and group:
        raise click.UsageError("--group only applies to --state aggregating")
    tasks = with_inspector(
        ctx, lambda insp: insp.list_tasks(queue, st, page=page, size=size, group=group)
    )
    if as_json:
        click.echo(to_json(tasks))
        return
    if not tasks:
        click.echo(f"No {st.value} tasks" + (" on this page" if page > 1 else ""))
        return
    headers, rows = task_rows(st, tasks, datetime.now(UTC))
    click.echo(table(headers, rows, keep=[0]))


def lookup_options(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """ID as an argument (or ``--id``/``-i``, the older spelling) and an optional queue."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--id", "-i", "id_option", metavar="ID", help="The same as ID (the older spelling)."
        )(fn)
        fn = click.option(
            "--queue", "-q", help=f"Queue of the {kind} [default: look in every queue]."
        )(fn)
        return click.argument("id_argument", metavar="ID", required=False)(fn)

    return wrap


def given_id(id_argument: str | None, id_option: str | None) -> str:
    """The one ID given, as ID or with --id."""
    if id_argument is None and id_option is None:
        raise click.UsageError("Missing argument 'ID'.")
    if id_argument is not None and id_option is not None and id_argument != id_option:
        raise click.UsageError(f"two IDs given ({id_argument!r} and --id {id_option!r}): give one")
    return id_argument if id_argument is not None else str(id_option)


@task.command("inspect")
@lookup_options("task")
@json_option
@click.pass_context
def task_inspect(
    ctx: click.Context,
    id_argument: str | None,
    queue: str | None,
    id_option: str | None,
    as_json: bool,
) -> None:
    """Show every detail of one task.

    ID is the task's ID or its start (the 8 characters the web UI, dash and
    events show), looked up in every queue unless --queue is given.
    """
    task_id = given_id(id_argument, id_option)
    info = with_inspector(ctx, lambda insp: insp.lookup_task(task_id, queue=queue))
    click.echo(to_json(info) if as_json else task_text(info))


@task.command("cancel", short_help="Cancel running tasks (retried; --no-retry: archived).")
@click.argument("task_ids", nargs=-1, required=True)
@click.option(
    "--retry/--no-retry",
    default=True,
    show_default=True,
    help="Retry the canceled tasks (asynq's cancel), or stop them for good: archived, "
    "not retried (asyncq servers; a Go server retries them).",
)
@click.pass_context
def task_cancel(ctx: click.Context, task_ids: tuple[str, ...], retry: bool) -> None:
    """Ask the servers running TASK_IDS to cancel them.

    The tasks are then retried, as in asynq; with --no-retry they are archived instead.
    """

    async def go(insp: Inspector) -> list[tuple[str, None, str | None]]:
        return await each(task_ids, lambda tid: insp.cancel(tid, retry=retry))

    results = with_inspector(ctx, go)
    for tid, _, err in results:
        if err is None:
            what = "cancelation" if retry else "cancelation (no retry)"
            click.echo(f"Sent {what} signal for task {tid}")
    report_errors(results)


def _task_action(
    ctx: click.Context, task_id: str, action: Callable[[Inspector], Awaitable[None]], done: str
) -> None:
    with_inspector(ctx, action)
    click.echo(f"Task {task_id} {done}")


@task.command("archive")
@queue_option
@id_option
@click.pass_context
def task_archive(ctx: click.Context, queue: str, task_id: str) -> None:
    """Archive one task (not active)."""
    _task_action(ctx, task_id, lambda insp: insp.archive_task(queue, task_id), "archived")


@task.command("delete")
@queue_option
@id_option
@click.pass_context
def task_delete(ctx: click.Context, queue: str, task_id: str) -> None:
    """Delete one task (not active)."""
    _task_action(ctx, task_id, lambda insp: insp.delete_task(queue, task_id), "deleted")


@task.command("run", short_help="Move one task to pending.")
@queue_option
@id_option
@click.pass_context
def task_run(ctx: click.Context, queue: str, task_id: str) -> None:
    """Move one scheduled, retry, archived, completed or aggregating task to pending."""
    _task_action(ctx, task_id, lambda insp: insp.run_task(queue, task_id), "moved to pending")


def _parse_headers(values: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="'--header'")
        headers[key] = value
    return headers


@task.command("enqueue", short_help="Enqueue a task.")
@click.option("--type", "-t", "type_", required=True, help="Task type name.")
@click.option("--payload", "-l", default="", help="Payload text (UTF-8).")
@click.option("--queue", "-q", help="Queue [default: default].")
@click.option("--max-retry", type=click.IntRange(min=0), help="Maximum retries [default: 25].")
@click.option("--timeout", type=DURATION, help="Timeout, e.g. 30s, 5m, 1h30m.")
@click.option("--deadline", type=TIME, help="Deadline, RFC 3339 (2024-05-01T12:00:00Z).")
@click.option("--unique", type=DURATION, help="Uniqueness lock TTL (at least 1s).")
@click.option("--process-at", type=TIME, help="Run at this RFC 3339 time.")
@click.option("--process-in", type=DURATION, help="Run after this delay.")
@click.option("--retention", type=DURATION, help="Keep the task this long after success.")
@click.option("--group", "-g", help="Aggregation group.")
@click.option("--task-id", "--id", "task_id", help="Task ID [default: a new UUID].")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="A header (repeat).")
@json_option
@click.pass_context
def task_enqueue(
    ctx: click.Context,
    *,
    type_: str,
    payload: str,
    queue: str | None,
    max_retry: int | None,
    timeout: timedelta | None,
    deadline: datetime | None,
    unique: timedelta | None,
    process_at: datetime | None,
    process_in: timedelta | None,
    retention: timedelta | None,
    group: str | None,
    task_id: str | None,
    headers: tuple[str, ...],
    as_json: bool,
) -> None:
    """Enqueue a task; only the options given are set (asynq's defaults apply)."""
    from asyncq._producer.client import Client
    from asyncq.task import EnqueueOptions, Task

    if process_at is not None and process_in is not None:
        raise click.UsageError("give --process-at or --process-in, not both")
    options: EnqueueOptions = {}
    given: dict[str, Any] = {
        "queue": queue,
        "max_retry": max_retry,
        "timeout": timeout,
        "deadline": deadline,
        "unique": unique,
        "process_at": process_at,
        "process_in": process_in,
        "retention": retention,
        "group": group,
        "task_id": task_id,
    }
    for key, value in given.items():
        if value is not None:
            options[key] = value  # type: ignore[literal-required]
    header_map = _parse_headers(headers)
    uri = settings(ctx).uri()

    async def go() -> TaskInfo:
        async with Client(uri, retry=None) as client:  # fail fast at a prompt
            new = Task(type_, payload.encode("utf-8"), headers=header_map or None)
            return await client.enqueue(new, **options)

    info = run_async(uri, go)
    if as_json:
        click.echo(to_json(info))
        return
    when = ""
    if info.state is TaskState.SCHEDULED and info.next_process_at is not None:
        when = f", runs at {format_time(info.next_process_at)}"
    click.echo(f'Enqueued task {info.id} to queue "{info.queue}" ({info.state.value}{when})')


def _bulk(
    ctx: click.Context,
    *,
    queue: str,
    state: str,
    group: str | None,
    action: Callable[[Inspector, TaskState, str | None], Awaitable[int]],
    done: str,
) -> None:
    st = TaskState(state.lower())
    if st is TaskState.AGGREGATING and not group:
        raise click.UsageError("--group is required with --state aggregating")
    if st is not TaskState.AGGREGATING and group:
        raise click.UsageError("--group only applies to --state aggregating")
    n = with_inspector(ctx, lambda insp: action(insp, st, group))
    click.echo(f"{n} {st.value} task{'s' if n != 1 else ''} {done}")


@task.command("archiveall")
@queue_option
@click.option("--state", "-s", required=True, type=state_choice(ARCHIVE_ALL_STATES))
@group_option
@click.pass_context
def task_archiveall(ctx: click.Context, queue: str, state: str, group: str | None) -> None:
    """Archive every task of a state.

    The archive keeps at most 9,999 tasks (asynq's cap) and none older than 90
    days: archiving past that deletes the oldest archived tasks; the command says
    how many before and after.
    """
    st = TaskState(state.lower())
    if st is TaskState.AGGREGATING and not group:
        raise click.UsageError("--group is required with --state aggregating")
    if st is not TaskState.AGGREGATING and group:
        raise click.UsageError("--group only applies to --state aggregating")

    async def go(insp: Inspector) -> ArchiveReport:
        info = await insp.queue_info(queue)
        over = info.archived + getattr(info, st.value) - ARCHIVE_LIMIT
        if st is not TaskState.AGGREGATING and over > 0:
            click.echo(
                f"warning: the archive keeps at most {ARCHIVE_LIMIT:,} tasks: about {over} "
                "of the oldest archived tasks will be deleted",
                err=True,
            )
        return await insp.archive_all_report(queue, st, group=group)

    report = with_inspector(ctx, go)
    n = report.moved
    click.echo(f"{n} {st.value} task{'s' if n != 1 else ''} archived{report.deleted_note}")


@task.command("deleteall")
@queue_option
@click.option("--state", "-s", required=True, type=state_choice(DELETE_ALL_STATES))
@group_option
@click.pass_context
def task_deleteall(ctx: click.Context, queue: str, state: str, group: str | None) -> None:
    """Delete every task of a state."""
    _bulk(
        ctx,
        queue=queue,
        state=state,
        group=group,
        action=lambda i, s, g: i.delete_all(queue, s, group=g),
        done="deleted",
    )


@task.command("runall")
@queue_option
@click.option("--state", "-s", required=True, type=state_choice(RUN_ALL_STATES))
@group_option
@click.pass_context
def task_runall(ctx: click.Context, queue: str, state: str, group: str | None) -> None:
    """Move every task of a state to pending."""
    _bulk(
        ctx,
        queue=queue,
        state=state,
        group=group,
        action=lambda i, s, g: i.run_all(queue, s, group=g),
        done="moved to pending",
    )


# -- group, server, cron ----------------------------------------------------------------------


@click.group()
def group() -> None:
    """Aggregation groups."""


@group.command("ls")
@queue_option
@json_option
@click.pass_context
def group_ls(ctx: click.Context, queue: str, as_json: bool) -> None:
    """List a queue's groups with their sizes."""
    groups = with_inspector(ctx, lambda insp: insp.groups(queue))
    if as_json:
        click.echo(to_json(groups))
    elif not groups:
        click.echo("No groups")
    else:
        click.echo(table(["Group", "Size"], [[g.group, str(g.size)] for g in groups]))


@click.group()
def server() -> None:
    """Worker servers (asyncq and Go asynq)."""


@server.command("ls")
@json_option
@click.pass_context
def server_ls(ctx: click.Context, as_json: bool) -> None:
    """List live servers."""
    servers = with_inspector(ctx, lambda insp: insp.servers())
    if as_json:
        click.echo(to_json(servers))
        return
    if not servers:
        click.echo("No running servers")
        return
    now = datetime.now(UTC)
    rows = [
        [
            s.host,
            str(s.pid),
            s.status,
            f"{len(s.active_workers)}/{s.concurrency}",
            " ".join(f"{q}:{p}" for q, p in sorted(s.queues.items(), key=lambda x: -x[1])),
            relative(s.started, now),
        ]
        for s in servers
    ]
    click.echo(table(["Host", "PID", "State", "Active Workers", "Queues", "Started"], rows))
    for s in servers:  # asyncq servers with per-type rate limits (Go servers have none)
        if s.type_rate_limits:
            rates = ", ".join(f"{t} {r}" for t, r in sorted(s.type_rate_limits.items()))
            click.echo(f"{s.host}:{s.pid} type rates: {rates}")
        flow = _server_flow_text(s)
        if flow:
            click.echo(f"{s.host}:{s.pid} queue flow control: {flow}")


def _server_flow_text(s: ServerInfo) -> str:
    """A server's queue limits, rates and ordered queues, as configured (code or flags)."""
    parts = [f"limit {q}={n}" for q, n in sorted(s.queue_concurrency.items())]
    parts += [f"local limit {q}={n}" for q, n in sorted(s.local_queue_concurrency.items())]
    parts += [f"rate {q}={r}" for q, r in sorted(s.rate_limits.items())]
    parts += [f"ordered {q}" for q in sorted(s.ordered_queues)]
    return ", ".join(parts)


@click.group()
def cron() -> None:
    """Periodic task entries of running schedulers."""


@cron.command("ls")
@json_option
@click.pass_context
def cron_ls(ctx: click.Context, as_json: bool) -> None:
    """List scheduler entries."""
    entries = with_inspector(ctx, lambda insp: insp.scheduler_entries())
    if as_json:
        click.echo(to_json(entries))
        return
    if not entries:
        click.echo("No scheduler entries")
        return
    now = datetime.now(UTC)
    blocks = []
    for e in entries:
        fields = [
            ("Spec", e.spec),
            ("Type", e.task_type),
            ("Payload", format_payload(e.task_payload) if e.task_payload else "-"),
            ("Options", ", ".join(e.options) or "-"),
            ("Next", f"{format_time(e.next)} ({relative(e.next, now)})"),
            ("Prev", f"{format_time(e.prev)} ({relative(e.prev, now)})" if e.prev else "never"),
        ]
        blocks.append("\n".join([e.id, *(f"  {k + ':':<9}{v}" for k, v in fields)]))
    # One block per entry: a 36-character ID leaves no room for a table in 80 columns.
    click.echo("\n\n".join(blocks))


@cron.command("history")
@click.argument("entry_ids", nargs=-1, required=True)
@click.option(
    "--page", type=click.IntRange(min=1, max=MAX_PAGE), default=1, show_default=True, help="Page."
)
@click.option(
    "--size",
    type=click.IntRange(min=1, max=MAX_PAGE_SIZE),
    default=30,
    show_default=True,
    help="Page size.",
)
@json_option
@click.pass_context
def cron_history(
    ctx: click.Context, entry_ids: tuple[str, ...], page: int, size: int, as_json: bool
) -> None:
    """Tasks enqueued by scheduler entries, newest first."""

    async def go(insp: Inspector) -> list[tuple[str, Any, str | None]]:
        return await each(
            entry_ids, lambda e: insp.scheduler_enqueue_events(e, page=page, size=size)
        )

    results = with_inspector(ctx, go)
    if as_json:
        click.echo(to_json({e: events for e, events, _ in results if events is not None}))
    else:
        blocks = []
        for entry, events, _ in results:
            if events is None:
                continue
            if not events:
                blocks.append(f"Entry: {entry}\n\nNo enqueue events")
                continue
            body = table(
                ["Enqueued At", "Task ID"],
                [[format_time(ev.enqueued_at), ev.task_id] for ev in events],
                keep=[1],
            )
            blocks.append(f"Entry: {entry}\n\n{body}")
        if blocks:
            click.echo("\n\n".join(blocks))
    report_errors(results)


@click.command()
@click.option(
    "--refresh",
    "-r",
    type=click.FloatRange(min=1),
    default=5,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.pass_context
def dash(ctx: click.Context, refresh: float) -> None:
    """Live terminal dashboard: queues -> tasks by state -> one task.

    Keys: Enter open, q/Esc back, p pause/resume queue, r run, a archive,
    d delete, [ ] previous/next page, left/right change state, ? help.
    """
    require_extra("textual", "dash", "asyncq dash")
    from asyncq.cli.dash import DashApp

    uri = settings(ctx).uri()
    with_inspector(ctx, lambda insp: insp.queues())  # fail before taking over the terminal
    app = DashApp(uri, refresh=refresh)
    run_async(uri, app.run_async)
    if app.fatal_error is not None:
        raise CliError(app.fatal_error)


def register(main: click.Group) -> None:
    """Attach the commands of this module to the ``asyncq`` group."""
    main.add_command(stats)
    main.add_command(queue)
    main.add_command(task)
    main.add_command(group)
    main.add_command(server)
    main.add_command(cron)
    main.add_command(dash)
