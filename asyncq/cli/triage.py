"""Failure triage on the command line: ``asyncq task errors``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import click

from asyncq._inspection.inspector import ERROR_SCAN_LIMIT, Inspector
from asyncq._inspection.records import ErrorGroupResult, ErrorReport
from asyncq.cli._commands import json_option, task, with_inspector
from asyncq.cli._format import relative, to_json

__all__ = ["errors", "register"]

_ACTIONS = ("run", "archive", "delete")


def _counts(counts: dict[str, int], *, most: int = 3) -> str:
    items = [f"{name or '?'} {n:,}" for name, n in list(counts.items())[:most]]
    if len(counts) > most:
        items.append(f"+{len(counts) - most} more")
    return ", ".join(items)


def report_text(report: ErrorReport, now: datetime) -> str:
    """A line saying how much was read, then three lines per group, largest first::

    9  ConnectionError: Error <n> connecting to <ip>. Connection refused.
       key 0946a002fcfb  archived 6, retry 3  first 31m ago, last 2m ago
       types email 6, sms 3  queues default 7, critical 2
    """
    what = f"{report.scanned:,} of {report.total:,}" if report.capped else f"{report.total:,}"
    head = f"{len(report.groups)} error group{'s' if len(report.groups) != 1 else ''} in {what}"
    head += " failed tasks" + (" (the newest; raise --limit to read more)" if report.capped else "")
    width = max((len(f"{g.count:,}") for g in report.groups), default=1)
    pad = " " * (width + 2)
    lines = [head]
    for g in report.groups:
        lines += [
            "",
            f"{g.count:>{width},}  {g.signature or '(empty error)'}",
            f"{pad}key {g.key}  {_counts(g.states)}  "
            f"first {relative(g.first_seen, now)}, last {relative(g.last_seen, now)}",
            f"{pad}types {_counts(g.task_types)}  queues {_counts(g.queues)}",
        ]
    return "\n".join(lines)


@click.command("errors", short_help="Failed tasks grouped by error; act on a group.")
@click.option(
    "--queue", "-q", "queues", multiple=True, help="Queue to read (repeatable; default: all)."
)
@click.option(
    "--state",
    "-s",
    "states",
    multiple=True,
    type=click.Choice(["retry", "archived"], case_sensitive=False),
    help="State to read (repeatable; default: retry and archived).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=ERROR_SCAN_LIMIT,
    show_default=True,
    help="Tasks read at most, newest first (0: no limit).",
)
@click.option("--run", "run_key", metavar="KEY", help="Move the group's tasks to pending.")
@click.option("--archive", "archive_key", metavar="KEY", help="Archive the group's retry tasks.")
@click.option("--delete", "delete_key", metavar="KEY", help="Delete the group's tasks.")
@json_option
@click.pass_context
def errors(
    ctx: click.Context,
    *,
    queues: tuple[str, ...],
    states: tuple[str, ...],
    limit: int,
    run_key: str | None,
    archive_key: str | None,
    delete_key: str | None,
    as_json: bool,
) -> None:
    """Group retry and archived tasks by error signature: the exception type and the
    message with numbers, hex ids, UUIDs, addresses and quoted strings folded.

    Each group shows its KEY; pass it to --run, --archive or --delete to act on
    every task of the group (tasks that moved or failed again with another error
    since are skipped and counted).
    """
    chosen = [
        (a, k) for a, k in zip(_ACTIONS, (run_key, archive_key, delete_key), strict=True) if k
    ]
    if len(chosen) > 1:
        raise click.UsageError("give at most one of --run, --archive, --delete")
    queue_arg = list(queues) or None
    state_arg = tuple(s.lower() for s in states) or ("retry", "archived")
    if chosen:
        action, key = chosen[0]

        def act(insp: Inspector) -> Awaitable[ErrorGroupResult]:
            fn: Callable[..., Awaitable[ErrorGroupResult]] = getattr(insp, f"{action}_error_group")
            return fn(key.strip().lower(), queues=queue_arg, states=state_arg)

        result = with_inspector(ctx, act)
        if as_json:
            click.echo(to_json(result))
            return
        done = {"run": "moved to pending", "archive": "archived", "delete": "deleted"}[action]
        line = f"{result.acted:,} task{'s' if result.acted != 1 else ''} {done}"
        if result.skipped:
            line += f"; {result.skipped:,} skipped (moved or failed again with another error)"
        click.echo(line)
        return
    report = with_inspector(
        ctx,
        lambda insp: insp.error_groups(queue_arg, states=state_arg, limit=limit or None),
    )
    if as_json:
        data = {
            "scanned": report.scanned,
            "total": report.total,
            "capped": report.capped,
            "groups": report.groups,
        }
        click.echo(to_json(data))
        return
    click.echo(report_text(report, datetime.now(UTC)))


def register(main: click.Group) -> None:
    """Attach ``errors`` to the ``task`` group (which :mod:`._commands` puts on *main*)."""
    if main.get_command(click.Context(main), "task") is not task:
        raise RuntimeError("register the task group before asyncq.cli.triage")
    task.add_command(errors)
