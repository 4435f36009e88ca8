"""The event stream on the command line: ``asyncq events tail``."""

from __future__ import annotations

import json

import click

from asyncq._inspection.inspector import Inspector
from asyncq.cli._commands import json_option, with_inspector
from asyncq.events import EVENT_KINDS, Event, read_events

__all__ = ["events", "register"]


def event_line(e: Event) -> str:
    """``12:00:01.250  succeeded  default  email:send  <task id>  <detail>``; a workflow
    step's detail starts with ``workflow=<id>``."""
    detail = f"{int((e.fraction or 0) * 100)}% {e.message}" if e.kind == "progress" else e.error
    when = e.time.strftime("%H:%M:%S.%f")[:-3]
    detail = " ".join(detail.split())
    if e.workflow:
        detail = f"workflow={e.workflow} {detail}"
    return f"{when}  {e.kind:<9}  {e.queue}  {e.type}  {e.task_id}  {detail}".rstrip()


@click.group()
def events() -> None:
    """Read the task event stream (servers and clients with events=...)."""


@events.command("tail")
@click.option("-q", "--queue", "queues", multiple=True, help="Only this queue (repeatable).")
@click.option("-t", "--type", "types", multiple=True, help="Only this task type (repeatable).")
@click.option(
    "-k", "--kind", "kinds", multiple=True, type=click.Choice(EVENT_KINDS),
    help="Only this event kind (repeatable).",
)  # fmt: skip
@click.option(
    "-w", "--workflow", "workflows", multiple=True,
    help="Only the events of this workflow's steps (repeatable).",
)  # fmt: skip
@click.option("--task", "task_ids", multiple=True, help="Only this task's events (repeatable).")
@click.option("--since", default=None, help="Start after this event ID ('0': the oldest kept).")
@click.option(
    "-n", "--count", type=click.IntRange(min=1), default=None, help="Stop after N events."
)
@json_option
@click.pass_context
def tail(
    ctx: click.Context,
    *,
    queues: tuple[str, ...],
    types: tuple[str, ...],
    kinds: tuple[str, ...],
    workflows: tuple[str, ...],
    task_ids: tuple[str, ...],
    since: str | None,
    count: int | None,
    as_json: bool,
) -> None:
    """Print events as they come (Ctrl-C stops), one line each or one JSON object a line."""

    async def go(insp: Inspector) -> None:
        stream = read_events(
            insp.redis, queues=queues or None, types=types or None, kinds=kinds or None,
            workflows=workflows or None, task_ids=task_ids or None, since=since,
        )  # fmt: skip
        seen = 0
        async for event in stream:
            click.echo(json.dumps(event.as_dict()) if as_json else event_line(event))
            seen += 1
            if count is not None and seen >= count:
                return

    with_inspector(ctx, go)


def register(main: click.Group) -> None:
    main.add_command(events)
