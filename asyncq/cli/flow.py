"""``asyncq queue limit``: read, set or clear a queue's fleet-wide concurrency limit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from asyncq._worker.queueset import is_pattern, validate_pattern
from asyncq.cli._app import CliError
from asyncq.cli._commands import queue, with_inspector
from asyncq.inspector import Inspector

__all__ = ["LimitsType", "limit", "parse_limits", "register"]


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
            return f'Limited queue "{queue_name}" to {value} running tasks fleet-wide'
        current = await insp.limit(queue_name)
        if current is None:
            return f'Queue "{queue_name}" has no stored limit'
        return f'Queue "{queue_name}": at most {current} running tasks fleet-wide'

    click.echo(with_inspector(ctx, go))


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
            return f'Queue "{queue_name}" is {"now" if value == "on" else "no longer"} ordered'
        flag = await insp.ordered(queue_name)
        return f'Queue "{queue_name}" is {"" if flag else "not "}ordered'

    click.echo(with_inspector(ctx, go))


def register() -> None:
    """Add ``limit`` and ``ordered`` to the ``asyncq queue`` group."""
    queue.add_command(limit)
    queue.add_command(ordered)
