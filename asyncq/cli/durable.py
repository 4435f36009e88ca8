"""``asyncq durable ls|inspect|cancel|signal``: the durable runs of a queue, a run's
entries and what it waits for, cancelling it, and sending a signal."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from asyncq import DurableRunInfo, Inspector
from asyncq._inspection.durable_runs import run_json, summary_json
from asyncq._inspection.records import DurableRunPage, DurableWait
from asyncq.cli._app import run_async, settings
from asyncq.cli._commands import given_id, json_option
from asyncq.cli._format import format_time, next_page_hint, table

__all__ = ["durable", "register"]

_SHOWN_RESULT = 60
"""Characters of a recorded result shown in ``inspect``'s table (--json has all)."""


def _with_inspector(ctx: click.Context, fn: Any) -> Any:
    uri = settings(ctx).uri()

    async def go() -> Any:
        async with Inspector(uri) as inspector:
            return await fn(inspector)

    return run_async(uri, go)


def _waits(wait: DurableWait | None) -> str:
    if wait is None:
        return "-"
    until = f" until {format_time(wait.until)}" if wait.until is not None else ""
    return wait.describe() + until


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN_RESULT else text[: _SHOWN_RESULT - 1] + "…"


def _text(info: DurableRunInfo) -> str:
    lines = [
        f"Run:        {info.id}",
        f"Queue:      {info.queue}",
        f"Function:   {info.type or '- (its task is gone)'}",
        f"State:      {info.state}",
        f"Task:       {info.task_state or '-'}",
        f"Waits for:  {_waits(info.waiting_for)}",
        f"Steps:      {info.steps_done}/{info.steps_total} recorded",
        f"Updated:    {format_time(info.updated)}",
    ]
    if info.last_error:
        lines.append(f"Error:      {info.last_error}")
    if not info.entries:
        return "\n".join([*lines, "No entries recorded yet."])
    rows = []
    for e in info.entries:
        if e.error is not None:
            outcome = "error: " + e.error
        elif e.result is not None:
            outcome = e.result.decode("utf-8", "replace") or "(timed out)"
        else:
            outcome = "(waiting)" if e.waited_for else "-"
        rows.append(
            [
                str(e.index),
                e.kind,
                e.signature,
                _short(outcome),
                format_time(e.deadline) if e.deadline else "",
            ]
        )
    return "\n".join(lines) + "\n\n" + table(["#", "Kind", "Asked", "Result", "Deadline"], rows)


def _queue_option(fn: Any) -> Any:
    return click.option(
        "--queue", "-q", default="default", show_default=True, help="The runs' queue."
    )(fn)


def _id_options(fn: Any) -> Any:
    fn = click.option("--id", "-i", "id_option", metavar="ID", help="The same as ID.")(fn)
    fn = _queue_option(fn)
    return click.argument("id_argument", metavar="ID", required=False)(fn)


@click.group("durable", short_help="Inspect, cancel and signal durable runs.")
def durable() -> None:
    """Inspect, cancel and signal durable runs (docs/durable.md)."""


@durable.command("ls")
@click.option("--queue", "-q", default=None, help="Only this queue's runs [default: all].")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="At most this many runs (a page).",
)
@click.option("--cursor", default=None, help="Where the previous page ended (printed with it).")
@json_option
@click.pass_context
def durable_ls(
    ctx: click.Context, queue: str | None, limit: int, cursor: str | None, as_json: bool
) -> None:
    """List durable runs: id, function, state, what it waits for, steps recorded.

    Runs are found by their records (there is no index): each page SCANs the
    queues in bounded chunks, in no particular order, and may hold fewer rows
    than --limit while more follow (run again with the --cursor it prints). A
    run not attempted yet has no record and is not listed.
    """
    try:
        page: DurableRunPage = _with_inspector(
            ctx, lambda i: i.durable_runs(queue, limit=limit, cursor=cursor)
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--queue/--cursor/--limit") from None
    if as_json:
        rows = [summary_json(r) for r in page.runs]
        click.echo(json.dumps({"runs": rows, "cursor": page.cursor}, indent=2))
        return
    if page.runs:
        click.echo(
            table(
                ["ID", "Queue", "Function", "State", "Waits for", "Steps", "Updated"],
                [
                    [
                        r.id,
                        r.queue,
                        r.type or "-",
                        r.state,
                        _waits(r.waiting_for),
                        f"{r.steps_done}/{r.steps_total}",
                        format_time(r.updated),
                    ]
                    for r in page.runs
                ],
                keep=(0,),
            )
        )
    else:
        click.echo("No durable runs." if page.cursor is None else "No durable runs in this chunk.")
    if page.cursor is not None:
        click.echo(next_page_hint("asyncq durable ls", queue, limit, page.cursor))


@durable.command("inspect")
@_id_options
@json_option
@click.pass_context
def durable_inspect(
    ctx: click.Context, id_argument: str | None, queue: str, id_option: str | None, as_json: bool
) -> None:
    """Show a durable run: its state, what it waits for, and every entry of its record
    in order (what the function asked for, its result or error, its deadline)."""
    run_id = given_id(id_argument, id_option)
    info: DurableRunInfo = _with_inspector(ctx, lambda i: i.get_durable_run(queue, run_id))
    click.echo(json.dumps(run_json(info), indent=2) if as_json else _text(info))


@durable.command("cancel")
@_id_options
@click.pass_context
def durable_cancel(
    ctx: click.Context, id_argument: str | None, queue: str, id_option: str | None
) -> None:
    """Cancel a durable run: a pending or waiting run is archived at once (its record
    kept, marked cancelled); a running run's attempt is stopped and its worker archives it."""
    run_id = given_id(id_argument, id_option)
    before: str = _with_inspector(ctx, lambda i: i.cancel_durable_run(queue, run_id))
    if before in ("pending", "waiting"):
        click.echo(f"Durable run {run_id} cancelled")
    elif before == "running":
        click.echo(f"Durable run {run_id} cancelled: its running attempt is being stopped")
    else:
        click.echo(f"Durable run {run_id} was already {before}; nothing changed")


@durable.command("signal")
@click.argument("name")
@_queue_option
@click.option("--key", "-k", default="", help="The signal's key [default: none].")
@click.option(
    "--payload",
    "-p",
    default="null",
    show_default=True,
    help="The signal's payload, as JSON.",
)
@click.option(
    "--keep",
    type=click.FloatRange(min=0.001),
    default=24 * 3600.0,
    show_default=True,
    help="Seconds it is kept for the first run to wait for it when none waits yet.",
)
@click.pass_context
def durable_signal(
    ctx: click.Context, *, name: str, queue: str, key: str, payload: str, keep: float
) -> None:
    """Send the signal NAME (with --key) to the runs of the queue waiting for it, as
    ``app.signal`` does; prints how many took it."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    took: int = _with_inspector(
        ctx,
        lambda i: i.signal(queue, name, key=key, payload=value, keep=timedelta(seconds=keep)),
    )
    if took:
        click.echo(f"Signal {name!r} taken by {took} run{'s' if took != 1 else ''}")
    else:
        click.echo(f"Signal {name!r}: no run waits for it; kept for the first that does")


def register(group: click.Group) -> None:
    group.add_command(durable)
