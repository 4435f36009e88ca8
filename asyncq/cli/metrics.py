"""The metrics history on the command line: ``asyncq metrics top``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import click

from asyncq._cancel import raise_if_cancelling
from asyncq._duration import format_short
from asyncq._inspection.inspector import Inspector
from asyncq.cli._commands import DURATION, json_option, with_inspector
from asyncq.cli._format import table, to_json
from asyncq.cli.web import metrics
from asyncq.history import TypeMetrics

__all__ = ["metrics_top", "register", "top_text"]

_SORTS = {
    "processed": lambda m: (m.processed, m.failed),
    "failed": lambda m: (m.failed, m.processed),
    "failure-rate": lambda m: (m.failure_rate, m.failed),
    "p95": lambda m: (m.p95 or 0.0, m.processed),
}
_HEADERS = (
    "TYPE", "QUEUE", "PROCESSED", "FAILED", "FAIL%", "RETRIED", "ARCHIVED", "P50", "P95", "P99",
)  # fmt: skip


def seconds_text(value: float | None) -> str:
    """A run time for a table cell: 0.8ms, 42ms, 1.25s, 3m20s; ``-`` without runs."""
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value * 1000:.1f}ms"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.2f}s"
    return format_short(timedelta(seconds=round(value)))


def top(rows: Sequence[TypeMetrics], sort: str, limit: int) -> list[TypeMetrics]:
    """The *limit* task types (0: all) of *rows* with the most *sort*, most first."""
    ranked = sorted(rows, key=_SORTS[sort], reverse=True)
    return ranked[:limit] if limit else ranked


def top_text(
    rows: Sequence[TypeMetrics], *, sort: str, limit: int, window: timedelta, now: datetime
) -> str:
    """A heading line, then one table row per task type (see ``asyncq metrics top``)."""
    shown = top(rows, sort, limit)
    runs = sum(m.processed for m in rows)
    head = (
        f"{now:%H:%M:%S} UTC  last {format_short(window)}: "
        f"{runs:,} run{'s' if runs != 1 else ''} of "
        f"{len(rows)} task type{'s' if len(rows) != 1 else ''}, by {sort}"
    )
    if not rows:
        return head + "\n(no history in this window: workers write it every few seconds)"
    body = table(
        _HEADERS,
        [
            (
                m.task_type,
                m.queue,
                f"{m.processed:,}",
                f"{m.failed:,}",
                f"{m.failure_rate * 100:.1f}",
                f"{m.retried:,}",
                f"{m.archived:,}",
                seconds_text(m.p50),
                seconds_text(m.p95),
                seconds_text(m.p99),
            )
            for m in shown
        ],
    )
    return f"{head}\n{body}"


@click.command("top", short_help="Top task types over a window, like top.")
@click.option(
    "--window",
    "-w",
    type=DURATION,
    default="1h",
    show_default=True,
    help="How far back to read (whole minutes, up to 7 days).",
)
@click.option(
    "--sort",
    "-s",
    type=click.Choice(list(_SORTS), case_sensitive=False),
    default="processed",
    show_default=True,
    help="What ranks the task types.",
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Rows shown at most (0: all).",
)
@click.option(
    "--queue", "-q", "queues", multiple=True, help="Queue to read (repeatable; default: all)."
)
@click.option("--watch", is_flag=True, help="Redraw every --interval until Ctrl-C.")
@click.option(
    "--interval",
    type=DURATION,
    default="5s",
    show_default=True,
    help="Time between two redraws with --watch.",
)
@json_option
@click.pass_context
def metrics_top(
    ctx: click.Context,
    *,
    window: timedelta,
    sort: str,
    limit: int,
    queues: tuple[str, ...],
    watch: bool,
    interval: timedelta,
    as_json: bool,
) -> None:
    """The task types with the most runs (or failures, failure rate, p95 run time) over
    the last --window, with their counts and p50/p95/p99 run times, from the metrics
    history the workers keep in Redis (per minute, 24 h by default; a worker started
    with --no-metrics-history or Server(metrics_history=False) keeps none)."""
    if window < timedelta(minutes=1) or window.total_seconds() % 60:
        raise click.BadParameter(
            f"must be a whole number of minutes, got {format_short(window)}",
            param_hint="--window",
        )
    if interval <= timedelta(0):
        raise click.BadParameter("must be positive", param_hint="--interval")
    if watch and as_json:
        raise click.UsageError("--watch and --json do not go together")
    sort = sort.lower()
    queue_arg = list(queues) or None

    async def read(insp: Inspector) -> list[TypeMetrics]:
        return await insp.metrics_history(queue_arg, window=window, step=window)

    if not watch:
        rows = with_inspector(ctx, read)
        if as_json:
            click.echo(to_json([_summary(m) for m in top(rows, sort, limit)]))
            return
        click.echo(top_text(rows, sort=sort, limit=limit, window=window, now=datetime.now(UTC)))
        return

    async def loop(insp: Inspector) -> None:
        while True:
            raise_if_cancelling()  # Ctrl-C's one cancel may have been swallowed by Redis I/O
            text = top_text(
                await read(insp), sort=sort, limit=limit, window=window, now=datetime.now(UTC)
            )
            click.clear()
            click.echo(text)
            await asyncio.sleep(interval.total_seconds())

    try:
        with_inspector(ctx, loop)
    except KeyboardInterrupt:
        return


def _summary(m: TypeMetrics) -> dict[str, object]:
    return {
        "task_type": m.task_type,
        "queue": m.queue,
        "processed": m.processed,
        "failed": m.failed,
        "failure_rate": m.failure_rate,
        "retried": m.retried,
        "archived": m.archived,
        "p50": m.p50,
        "p95": m.p95,
        "p99": m.p99,
        "mean": m.mean,
    }


def register(main: click.Group) -> None:
    """Attach ``top`` to the ``metrics`` group (which :mod:`.web` puts on *main*)."""
    if main.get_command(click.Context(main), "metrics") is not metrics:
        raise RuntimeError("register asyncq.cli.web before asyncq.cli.metrics")
    metrics.add_command(metrics_top)
