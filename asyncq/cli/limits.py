"""Flow-control commands: ``asyncq queue limit``/``ordered`` and ``asyncq typerate``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from asyncq._duration import format_short
from asyncq._inspection.inspector import Inspector
from asyncq._inspection.records import TypeRateInfo
from asyncq._worker.queueset import is_pattern, validate_pattern
from asyncq.cli._app import CliError
from asyncq.cli._commands import each, json_option, queue, report_errors, with_inspector
from asyncq.cli._format import table, to_json

__all__ = ["LimitsType", "limit", "parse_limits", "register", "typerate"]


def parse_limits(text: str) -> dict[str, int]:
    """``partner=2,dump=1`` -> {"partner": 2, "dump": 1}; every entry needs ``=N`` (N >= 0)."""
    limits: dict[str, int] = {}
    for item in text.split(","):
        name, sep, raw = item.strip().partition("=")
        name = name.strip()
        if not name or not sep:
            raise ValueError(f"invalid limit {item.strip()!r}: expected QUEUE=N, e.g. partner=2")
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(
                f"invalid limit {raw.strip()!r} for queue {name!r}: expected an integer"
            ) from None
        if value < 0:
            raise ValueError(f"limit of queue {name!r} must be 0 or more, got {value}")
        if name in limits:
            raise ValueError(f"queue {name!r} is listed twice")
        if is_pattern(name):
            validate_pattern("limits", name)
        limits[name] = value
    return limits


if TYPE_CHECKING:  # click >= 8.2 types ParamType by its value; older clicks are not generic
    _LimitsParam = click.ParamType[dict[str, int], Any]
else:
    _LimitsParam = click.ParamType


class LimitsType(_LimitsParam):
    """``QUEUE=N,...`` on the command line."""

    name = "limits"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        try:
            return parse_limits(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command("limit")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("value", metavar="[N]", required=False, type=click.IntRange(min=0))
@click.option("--clear", is_flag=True, help="Remove the stored limit.")
@click.pass_context
def limit(ctx: click.Context, queue_name: str, value: int | None, clear: bool) -> None:
    """Show, set (N) or clear (--clear) the fleet-wide concurrency limit of QUEUE.

    Every asyncq worker serving QUEUE honours a stored limit from its next
    fetch, without a restart: at most N of its tasks run at once across the
    fleet (0 holds every task back). It overrides the workers'
    queue_concurrency setting. Go asynq workers ignore it.

    \b
    Examples:
      asyncq queue limit partner_api 5
      asyncq queue limit partner_api --clear
    """
    if clear and value is not None:
        raise CliError("give either N or --clear, not both")

    async def go(insp: Inspector) -> str:
        if clear:
            await insp.set_limit(queue_name, None)
            return f'Cleared the limit of queue "{queue_name}"'
        if value is not None:
            await insp.set_limit(queue_name, value)
            return (
                f'Limited queue "{queue_name}" to {value} running tasks fleet-wide'
                + await _not_yet(insp, queue_name)
            )
        current = await insp.limit(queue_name)
        if current is None:
            return f'Queue "{queue_name}" has no stored limit'
        return f'Queue "{queue_name}": at most {current} running tasks fleet-wide'

    click.echo(with_inspector(ctx, go))


async def _not_yet(insp: Inspector, queue: str) -> str:
    """A note when *queue* has no task yet: the setting waits for it (or names a typo)."""
    if queue in await insp.queues():
        return ""
    return " (the queue has no task yet: the setting applies when its tasks come)"


@click.command("ordered")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("value", metavar="[on|off]", required=False, type=click.Choice(["on", "off"]))
@click.pass_context
def ordered(ctx: click.Context, queue_name: str, value: str | None) -> None:
    """Show, or turn on or off, the ordered flag of QUEUE.

    An ordered queue runs one task at a time across every asyncq worker, in
    enqueue order, and a failed task runs again before the tasks behind it.
    Go asynq workers ignore it.

    \b
    Examples:
      asyncq queue ordered delivery on
      asyncq queue ordered delivery off
    """

    async def go(insp: Inspector) -> str:
        if value is not None:
            await insp.set_ordered(queue_name, value == "on")
            return f'Queue "{queue_name}" is {"now" if value == "on" else "no longer"} ordered' + (
                await _not_yet(insp, queue_name)
            )
        flag = await insp.ordered(queue_name)
        return f'Queue "{queue_name}" is {"" if flag else "not "}ordered'

    click.echo(with_inspector(ctx, go))


@click.group()
def typerate() -> None:
    """Rate limits per task type (workers' --type-rate-limit)."""


def _servers_text(info: TypeRateInfo) -> str:
    if not info.servers:
        return "none live"
    return ", ".join(f"{n} at {rate}" for rate, n in info.servers.items())


def _tokens_text(info: TypeRateInfo) -> str:
    if info.tokens is None:
        return "-"  # no bucket: no task of the type has started in the last hour
    if info.tokens == 0 and info.next_token:
        return f"0 (next in {format_short(info.next_token)})"
    return str(info.tokens)


@typerate.command("ls")
@json_option
@click.pass_context
def typerate_ls(ctx: click.Context, as_json: bool) -> None:
    """List the task types whose rate live workers limit.

    Tokens: tasks of the type that may start now. Put back: tasks the rate
    sent back to the retry set (unrun, no retry used) since its bucket was
    created. Servers: live workers configuring it, by rate.
    """
    infos = with_inspector(ctx, lambda insp: insp.type_rates())
    if as_json:
        click.echo(to_json(infos))
        return
    if not infos:
        click.echo("No task type rate limits on live servers")
        return
    rows = [
        [i.task_type, i.rate or "-", _tokens_text(i), str(i.limited), _servers_text(i)]
        for i in infos
    ]
    click.echo(table(["Type", "Rate", "Tokens", "Put back", "Servers"], rows))
    _warn_disagreement(infos)


def _warn_disagreement(infos: list[TypeRateInfo]) -> None:
    for i in infos:
        if len(i.servers) > 1:
            click.echo(
                f"warning: live servers disagree on the rate of {i.task_type!r}: "
                f"{', '.join(i.servers)}",
                err=True,
            )


def _type_rate_text(i: TypeRateInfo) -> str:
    lines = [
        f"Task type: {i.task_type}",
        f"Rate: {i.rate or '-'}    Tokens now: {_tokens_text(i)}",
        f"Put back by the rate: {i.limited} (since the bucket was created)",
        f"Servers: {_servers_text(i)}",
    ]
    if i.tokens is None:
        lines.append("No bucket: no task of the type started in the last hour")
    return "\n".join(lines)


@typerate.command("inspect")
@click.argument("task_types", metavar="TYPES...", nargs=-1, required=True)
@json_option
@click.pass_context
def typerate_inspect(ctx: click.Context, task_types: tuple[str, ...], as_json: bool) -> None:
    """Show the rate limit of each of TYPES: rate, tokens now, tasks put back.

    \b
    Example:
      asyncq typerate inspect api:partner
    """

    async def one(insp: Inspector, task_type: str) -> TypeRateInfo:
        info = await insp.type_rate(task_type)
        if info is None:
            raise ValueError(
                f"task type {task_type!r} has no rate limit on a live server and no bucket"
            )
        return info

    results = with_inspector(ctx, lambda insp: each(task_types, lambda t: one(insp, t)))
    good = [info for _, info, _ in results if info is not None]
    if as_json:
        click.echo(to_json(good))
    elif good:
        click.echo("\n\n".join(_type_rate_text(i) for i in good))
        _warn_disagreement(good)
    report_errors(results)


def register(main: click.Group) -> None:
    """Add ``limit`` and ``ordered`` to the ``asyncq queue`` group, and ``typerate``."""
    queue.add_command(limit)
    queue.add_command(ordered)
    main.add_command(typerate)
