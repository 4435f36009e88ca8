"""``asyncq workflow ls|inspect|cancel``: the workflows, a workflow's steps and states,
and cancelling it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from asyncq import Inspector, WorkflowInfo
from asyncq._duration import format_short
from asyncq._inspection.records import WorkflowPage
from asyncq.cli._app import run_async, settings
from asyncq.cli._commands import given_id, lookup_options
from asyncq.cli._format import format_time, next_page_hint, table

__all__ = ["register", "workflow"]


def _with_inspector(ctx: click.Context, fn: Any) -> Any:
    uri = settings(ctx).uri()

    async def go() -> Any:
        async with Inspector(uri) as inspector:
            return await fn(inspector)

    return run_async(uri, go)


def _when(ts: int | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _retention(retention: timedelta) -> str:
    """How long the finished workflow's state is kept (docs/workflows.md, Retention)."""
    if retention <= timedelta(0):
        return "none (deleted when it finishes)"
    return format_short(retention)


def _as_dict(info: WorkflowInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "queue": info.queue,
        "state": info.state,
        "stage": info.stage,
        "on_failure": info.policy,
        "created": info.created,
        "finished": info.finished,
        "retention_seconds": int(info.retention.total_seconds()),
        "stages": [
            [
                {
                    "id": s.id,
                    "queue": s.queue,
                    "type": s.type,
                    "state": s.state,
                    "result_bytes": None if s.result is None else len(s.result),
                    "error": s.error,
                }
                for s in stage
            ]
            for stage in info.stages
        ],
    }


def _text(info: WorkflowInfo) -> str:
    lines = [
        f"Workflow:   {info.id}",
        f"Queue:      {info.queue}",
        f"State:      {info.state}",
        f"On failure: {info.policy}",
        f"Created:    {_when(info.created)}",
        f"Finished:   {_when(info.finished)}",
        f"Retention:  {_retention(info.retention)}",
    ]
    for k, stage in enumerate(info.stages):
        mark = "*" if k == info.stage and info.state == "running" else " "
        lines.append(f"{mark}Stage {k} ({len(stage)} task{'s' if len(stage) != 1 else ''}):")
        for s in stage:
            extra = f"  error: {s.error}" if s.error else ""
            lines.append(f"    {s.state:<10} {s.type}  id={s.id} queue={s.queue}{extra}")
    return "\n".join(lines)


@click.group("workflow", short_help="Inspect and cancel workflows.")
def workflow() -> None:
    """Inspect and cancel workflows (chains, groups, chords)."""


@workflow.command("ls")
@click.option("--queue", "-q", default=None, help="Only this queue's workflows [default: all].")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="At most this many workflows (a page).",
)
@click.option("--cursor", default=None, help="Where the previous page ended (printed with it).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def workflow_ls(
    ctx: click.Context, queue: str | None, limit: int, cursor: str | None, as_json: bool
) -> None:
    """List workflows: id, kind, state, steps done/total, created.

    There is no index of workflows: each page SCANs the queues in bounded chunks,
    so a page comes in no particular order and may hold fewer rows than --limit
    while more follow (run again with the --cursor it prints).
    """
    try:
        page: WorkflowPage = _with_inspector(
            ctx, lambda i: i.workflows(queue, limit=limit, cursor=cursor)
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cursor/--limit") from None
    if as_json:
        rows = [
            {
                "id": w.id,
                "queue": w.queue,
                "kind": w.kind,
                "state": w.state,
                "steps_done": w.steps_done,
                "steps_total": w.steps_total,
                "created": w.created.isoformat(),
                "finished": None if w.finished is None else w.finished.isoformat(),
            }
            for w in page.workflows
        ]
        click.echo(json.dumps({"workflows": rows, "cursor": page.cursor}, indent=2))
        return
    if page.workflows:
        click.echo(
            table(
                ["ID", "Queue", "Kind", "State", "Steps", "Created"],
                [
                    [
                        w.id,
                        w.queue,
                        w.kind,
                        w.state,
                        f"{w.steps_done}/{w.steps_total}",
                        format_time(w.created),
                    ]
                    for w in page.workflows
                ],
                keep=(0,),
            )
        )
    else:
        click.echo("No workflows." if page.cursor is None else "No workflows in this chunk.")
    if page.cursor is not None:
        click.echo(next_page_hint("asyncq workflow ls", queue, limit, page.cursor))


@workflow.command("inspect")
@lookup_options("workflow's first step")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def workflow_inspect(
    ctx: click.Context,
    id_argument: str | None,
    queue: str | None,
    id_option: str | None,
    as_json: bool,
) -> None:
    """Show a workflow's state and every step's state.

    ID is the workflow's id or its start, looked up under every queue unless
    --queue (its first step's queue) is given.
    """
    workflow_id = given_id(id_argument, id_option)
    info: WorkflowInfo = _with_inspector(ctx, lambda i: i.lookup_workflow(workflow_id, queue=queue))
    click.echo(json.dumps(_as_dict(info), indent=2) if as_json else _text(info))


@workflow.command("cancel")
@lookup_options("workflow's first step")
@click.pass_context
def workflow_cancel(
    ctx: click.Context, id_argument: str | None, queue: str | None, id_option: str | None
) -> None:
    """Cancel a workflow: steps not started are deleted, no further step is enqueued.

    ID is the workflow's id or its start (a prefix must match one workflow
    only), looked up under every queue unless --queue is given.
    """
    workflow_id = given_id(id_argument, id_option)

    async def go(insp: Inspector) -> tuple[str, str]:
        info = await insp.lookup_workflow(workflow_id, queue=queue)
        return info.id, await insp.cancel_workflow(info.queue, info.id)

    found_id, before = _with_inspector(ctx, go)
    if before == "running":
        click.echo(f"Workflow {found_id} canceled")
    else:
        click.echo(f"Workflow {found_id} was already {before}; nothing changed")


def register(group: click.Group) -> None:
    group.add_command(workflow)
