"""``asyncq dash``: a live terminal dashboard (textual).

Queues table -> one queue's tasks by state -> one task, plus the servers (``s``)
and schedulers (``c``) views. It refreshes every few seconds; ``p`` pauses/resumes
the selected queue, ``r``/``a``/``d`` run, archive
or delete the selected task (``d`` on the queues table removes an empty queue),
``[``/``]`` page, left/right change the state, ``q``/Esc go back, ``?`` shows help.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Header, Static, Tab, Tabs

from asyncq._duration import format_short
from asyncq._inspection.inspector import Inspector
from asyncq._inspection.records import QueueInfo, SchedulerEntry, ServerInfo, TypeRateInfo
from asyncq._redis.options import RedisTarget
from asyncq.cli._format import format_bytes, format_payload, relative, task_rows, task_text
from asyncq.errors import AsyncqError, TaskNotFoundError
from asyncq.task import TaskInfo, TaskState

__all__ = ["DashApp"]

T = TypeVar("T")

STATES = [
    TaskState.ACTIVE,
    TaskState.PENDING,
    TaskState.AGGREGATING,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
]
PAGE_SIZE = 20

HELP = """\
[b]asyncq dash[/b]

[b]Everywhere[/b]
  q / Esc     back (quit on the queues table)
  ?           this help
  Ctrl+C      quit

[b]Queues[/b]
  Enter       open the selected queue
  p           pause / resume the selected queue
  d           remove the selected queue (only when it is empty)
  s           servers and the tasks they are running
  c           schedulers (periodic tasks)

[b]Schedulers[/b]
  Enter       show the selected entry's recent enqueues

[b]Queue[/b]
  Enter       open the selected task
  left/right  previous / next state
  [ / ]       previous / next page
  g           next group (aggregating tasks)
  p           pause / resume this queue
  r / a / d   run / archive / delete the selected task

[b]Task[/b]
  r / a / d   run / archive / delete this task

Press any key to close."""


class HelpScreen(ModalScreen[None]):
    """The key bindings."""

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")

    def on_key(self, event: events.Key) -> None:
        event.stop()
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismissed with True on ``y``."""

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(f"{self.question}\n\n[b]y[/b] yes    [b]n[/b] / Esc no", id="confirm")

    def on_key(self, event: events.Key) -> None:
        event.stop()
        self.dismiss(event.key == "y")


class DashApp(App[None]):
    """The dashboard; *redis* is a URI, connection options or a redis.asyncio client."""

    TITLE = "asyncq"
    CSS = """
    #summary { height: auto; padding: 0 1; }
    #status { height: 1; padding: 0 1; color: $text-muted; }
    #details { padding: 1 2; }
    HelpScreen, ConfirmScreen { align: center middle; }
    #help, #confirm {
        width: auto; max-width: 80; height: auto;
        padding: 1 2; border: thick $primary; background: $surface;
    }
    """
    BINDINGS = [  # noqa: RUF012 - textual's declaration style
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, redis: RedisTarget, *, refresh: float = 5.0) -> None:
        super().__init__()
        if refresh < 0.1:
            raise ValueError(f"refresh must be at least 0.1 s, got {refresh}")
        self.redis_target = redis
        self.refresh_interval = refresh
        self._inspector: Inspector | None = None
        self.fatal_error: str | None = None
        """Why the dashboard could not start (shown by the CLI as one error line)."""

    @property
    def inspector(self) -> Inspector:
        if self._inspector is None:
            raise RuntimeError("the dashboard is not running")
        return self._inspector

    async def on_mount(self) -> None:
        try:
            self._inspector = Inspector(self.redis_target)
            await self._inspector.queues()
        except (RedisError, OSError, ValueError, AsyncqError) as exc:
            self.fatal_error = f"cannot start the dashboard: {exc}"
            self.exit()
            return
        await self.push_screen(QueuesScreen())

    async def on_unmount(self) -> None:
        if self._inspector is not None:
            await self._inspector.aclose()

    async def attempt(self, op: Awaitable[T]) -> tuple[bool, T | None]:
        """Await *op*; a failure becomes an error notification instead of a crash."""
        try:
            return True, await op
        except (AsyncqError, ValueError) as exc:
            self.notify(str(exc), severity="error", title="asyncq")
        except (RedisError, OSError) as exc:
            self.notify(f"Redis: {exc}", severity="error", title="asyncq")
        return False, None

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


class RefreshingScreen(Screen[None]):
    """A screen that reloads its data every ``refresh`` seconds while it is shown."""

    _timer: Timer | None = None
    _loading = False
    _suspended = False

    @property
    def dash(self) -> DashApp:
        app = self.app
        assert isinstance(app, DashApp)
        return app

    def setup(self) -> None:
        """Prepare widgets once mounted, before the first load (subclasses)."""

    async def load(self) -> None:
        """Fetch and show the screen's data (subclasses)."""
        raise NotImplementedError

    async def reload(self) -> None:
        if self._loading:  # a slow Redis: skip a tick rather than pile up
            return
        self._loading = True
        try:
            await self.load()
        finally:
            self._loading = False

    async def on_mount(self) -> None:
        # textual calls on_mount of every class in the MRO, so subclasses hook in
        # through setup() instead of overriding this handler.
        self.setup()
        await self.reload()
        self._timer = self.set_interval(self.dash.refresh_interval, self.reload)

    def on_screen_suspend(self) -> None:
        self._suspended = True
        if self._timer is not None:
            self._timer.pause()

    async def on_screen_resume(self) -> None:
        # Also sent when the screen is first shown; only a return from another screen
        # needs fresh data (e.g. after archiving a task on the task screen).
        if self._suspended and self._timer is not None:
            self._suspended = False
            self._timer.resume()
            await self.reload()

    def selected_key(self, table: DataTable[Any]) -> str | None:
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return None if key is None else str(key)

    def fill(
        self, table: DataTable[Any], rows: list[tuple[str, list[str]]], keep: str | None
    ) -> None:
        """Replace the rows, keeping the cursor on the same key when it is still there."""
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        keys = [k for k, _ in rows]
        if keep in keys:
            table.move_cursor(row=keys.index(keep))


class QueuesScreen(RefreshingScreen):
    """Every queue with its sizes by state and today's counters."""

    BINDINGS = [  # noqa: RUF012
        Binding("enter", "open", "Open"),
        Binding("p", "toggle_pause", "Pause/Resume"),
        Binding("d", "delete", "Remove"),
        Binding("s", "servers", "Servers"),
        Binding("c", "schedulers", "Schedulers"),
        Binding("q,escape", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.infos: dict[str, QueueInfo] = {}

    async def action_servers(self) -> None:
        await self.app.push_screen(ServersScreen())

    async def action_schedulers(self) -> None:
        await self.app.push_screen(SchedulersScreen())

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("Queues", id="summary")
        table: DataTable[str] = DataTable(id="queues", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static("", id="type-rates", markup=False)
        yield Static("", id="status")
        yield Footer()

    def setup(self) -> None:
        table = self.query_one("#queues", DataTable)
        table.add_columns(
            "Queue", "State", "Size", "Active", "Pending", "Aggregating", "Scheduled", "Retry",
            "Archived", "Completed", "Processed", "Failed", "Latency", "Memory",
        )  # fmt: skip
        table.focus()

    async def load(self) -> None:
        ok, names = await self.dash.attempt(self.dash.inspector.queues())
        if not ok or names is None:
            return
        infos: dict[str, QueueInfo] = {}
        for name in names:
            try:
                infos[name] = await self.dash.inspector.queue_info(name)
            except AsyncqError:
                continue  # removed meanwhile (or unreadable: a broker error)
            except ResponseError as exc:  # this queue's keys are damaged; the others show
                self.dash.notify(f"Redis: queue {name!r} left out: {exc}", severity="error")
                continue
            except (RedisError, OSError) as exc:
                self.dash.notify(f"Redis: {exc}", severity="error")
                return
        self.infos = infos
        table = self.query_one("#queues", DataTable)
        rows = [
            (
                q.queue,
                [
                    q.queue, "paused" if q.paused else "run", str(q.size), str(q.active),
                    str(q.pending), str(q.aggregating), str(q.scheduled), str(q.retry),
                    str(q.archived), str(q.completed), str(q.processed), str(q.failed),
                    format_short(q.latency), format_bytes(q.memory_usage),
                ],
            )
            for q in infos.values()
        ]  # fmt: skip
        self.fill(table, rows, self.selected_key(table))
        now = datetime.now(UTC).strftime("%H:%M:%S")
        self.query_one("#summary", Static).update(
            f"[b]Queues[/b] ({len(infos)})   processed today "
            f"{sum(q.processed for q in infos.values())}, failed "
            f"{sum(q.failed for q in infos.values())}"
        )
        ok, type_rates = await self.dash.attempt(self.dash.inspector.type_rates())
        if ok:
            self.query_one("#type-rates", Static).update(type_rates_line(type_rates or []))
        self.query_one("#status", Static).update(f"updated {now} UTC; Enter opens a queue")

    def _selected(self) -> QueueInfo | None:
        key = self.selected_key(self.query_one("#queues", DataTable))
        return None if key is None else self.infos.get(key)

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        await self.action_open()

    async def action_open(self) -> None:
        info = self._selected()
        if info is None:
            return
        # Open on the first state that holds tasks, like a person would.
        initial = next((s for s in STATES if getattr(info, s.value) > 0), TaskState.ACTIVE)
        await self.app.push_screen(QueueScreen(info.queue, initial))

    async def action_toggle_pause(self) -> None:
        info = self._selected()
        if info is None:
            return
        insp = self.dash.inspector
        op = insp.resume(info.queue) if info.paused else insp.pause(info.queue)
        ok, _ = await self.dash.attempt(op)
        if ok:
            verb = "resumed" if info.paused else "paused"
            self.dash.notify(f'Queue "{info.queue}" {verb}')
        await self.reload()

    def action_delete(self) -> None:
        info = self._selected()
        if info is None:
            return
        name = info.queue

        async def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            ok, _ = await self.dash.attempt(self.dash.inspector.delete_queue(name))
            if ok:
                self.dash.notify(f'Queue "{name}" removed')
            await self.reload()

        self.app.push_screen(ConfirmScreen(f'Remove queue "{name}"?'), confirmed)


def type_rates_line(infos: list[TypeRateInfo]) -> str:
    """``Type rates: api:partner 600/min (tokens 12, put back 3) ...``; empty without any."""
    if not infos:
        return ""
    parts = []
    for t in infos:
        if t.tokens is None:
            state = "no bucket yet"
        elif t.tokens == 0 and t.next_token:
            state = f"tokens 0, next in {format_short(t.next_token)}"
        else:
            state = f"tokens {t.tokens}"
        disagree = f", servers disagree: {', '.join(t.servers)}" if len(t.servers) > 1 else ""
        parts.append(f"{t.task_type} {t.rate or '-'} ({state}, put back {t.limited}{disagree})")
    return "Type rates: " + "; ".join(parts)


class QueueScreen(RefreshingScreen):
    """One queue's tasks, one state at a time, a page at a time."""

    BINDINGS = [  # noqa: RUF012
        Binding("q,escape", "back", "Back"),
        Binding("enter", "open", "Open"),
        Binding("left", "state(-1)", "State", priority=True),
        Binding("right", "state(1)", "State", priority=True),
        Binding("left_square_bracket", "page(-1)", "Page"),
        Binding("right_square_bracket", "page(1)", "Page"),
        Binding("g", "next_group", "Group", show=False),
        Binding("p", "toggle_pause", "Pause/Resume"),
        Binding("r", "run", "Run"),
        Binding("a", "archive", "Archive"),
        Binding("d", "delete", "Delete"),
    ]

    def __init__(self, queue: str, state: TaskState = TaskState.ACTIVE) -> None:
        super().__init__()
        self.queue = queue
        self.state = state
        self.page = 1
        self.group: str | None = None
        self.groups: list[str] = []
        self.info: QueueInfo | None = None
        self.tasks: dict[str, TaskInfo] = {}
        self._columns_for: TaskState | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Static(f"Queue {self.queue}", id="summary")
            tabs = [Tab(s.value, id=f"tab-{s.value}") for s in STATES]
            yield Tabs(*tabs, active=f"tab-{self.state.value}", id="states")
            table: DataTable[str] = DataTable(id="tasks", cursor_type="row", zebra_stripes=True)
            yield table
            yield Static("", id="status")
        yield Footer()

    def setup(self) -> None:
        self.query_one("#states", Tabs).can_focus = False
        self.query_one("#tasks", DataTable).focus()

    async def load(self) -> None:
        insp = self.dash.inspector
        ok, info = await self.dash.attempt(insp.queue_info(self.queue))
        if not ok or info is None:
            return
        self.info = info
        for s in STATES:
            self.query_one(f"#tab-{s.value}", Tab).label = f"{s.value} ({getattr(info, s.value)})"
        tasks: list[TaskInfo] = []
        if self.state is TaskState.AGGREGATING:
            ok, groups = await self.dash.attempt(insp.groups(self.queue))
            self.groups = [g.group for g in groups or []]
            if self.group not in self.groups:
                self.group = self.groups[0] if self.groups else None
        # The group picks aggregating tasks only; the other states list the whole queue.
        group = self.group if self.state is TaskState.AGGREGATING else None
        if self.state is not TaskState.AGGREGATING or group is not None:
            ok, listed = await self.dash.attempt(
                insp.list_tasks(self.queue, self.state, page=self.page, size=PAGE_SIZE, group=group)
            )
            tasks = listed or []
        self.tasks = {t.id: t for t in tasks}
        headers, rows = task_rows(self.state, tasks, datetime.now(UTC))
        table = self.query_one("#tasks", DataTable)
        if self._columns_for is not self.state:
            table.clear(columns=True)
            table.add_columns(*headers)
            self._columns_for = self.state
        self.fill(table, [(r[0], r) for r in rows], self.selected_key(table))
        self.query_one("#summary", Static).update(
            f"[b]Queue {self.queue}[/b]  {'[red]paused[/red]' if info.paused else 'running'}  "
            f"size {info.size}  latency {format_short(info.latency)}  "
            f"memory {format_bytes(info.memory_usage)}  today: processed {info.processed}, "
            f"failed {info.failed}"
            + (
                f"  limit {info.concurrency_limit} (running {info.running}, "
                f"held back {info.held_back})"
                if info.concurrency_limit is not None
                else ""
            )
            + (
                f"  rate {info.rate_limit} (tokens {info.rate_tokens})"
                if info.rate_limit is not None
                else ""
            )
            + ("  ordered" if info.ordered else "")
            + (
                f"  [dim]set by servers: {info.configured_text}[/dim]"
                if info.configured_text
                else ""
            )
        )
        label = f"  group {group} (g: next of {len(self.groups)})" if group else ""
        empty = "  (no groups)" if self.state is TaskState.AGGREGATING and not group else ""
        self.query_one("#status", Static).update(
            f"{self.state.value} tasks, page {self.page} ({len(tasks)} shown){label}{empty}"
        )

    async def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        event.stop()
        if event.tab is None or event.tab.id is None:
            return
        state = TaskState(event.tab.id.removeprefix("tab-"))
        if state is not self.state:
            self.state = state
            self.page = 1
            await self.reload()

    def action_state(self, step: int) -> None:
        i = (STATES.index(self.state) + step) % len(STATES)
        self.query_one("#states", Tabs).active = f"tab-{STATES[i].value}"

    async def action_page(self, step: int) -> None:
        if step < 0 and self.page == 1:
            return
        if step > 0 and len(self.tasks) < PAGE_SIZE:
            self.dash.notify("This is the last page")
            return
        self.page += step
        await self.reload()

    async def action_next_group(self) -> None:
        if self.state is not TaskState.AGGREGATING or not self.groups:
            return
        i = self.groups.index(self.group) if self.group in self.groups else -1
        self.group = self.groups[(i + 1) % len(self.groups)]
        self.page = 1
        await self.reload()

    def action_back(self) -> None:
        self.app.pop_screen()

    def _selected(self) -> TaskInfo | None:
        key = self.selected_key(self.query_one("#tasks", DataTable))
        return None if key is None else self.tasks.get(key)

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        await self.action_open()

    async def action_open(self) -> None:
        task = self._selected()
        if task is not None:
            await self.app.push_screen(TaskScreen(self.queue, task.id))

    async def action_toggle_pause(self) -> None:
        if self.info is None:
            return
        insp = self.dash.inspector
        paused = self.info.paused
        ok, _ = await self.dash.attempt(
            insp.resume(self.queue) if paused else insp.pause(self.queue)
        )
        if ok:
            self.dash.notify(f'Queue "{self.queue}" {"resumed" if paused else "paused"}')
        await self.reload()

    async def action_run(self) -> None:
        task = self._selected()
        if task is not None and await task_action(self.dash, "run", task):
            await self.reload()

    async def action_archive(self) -> None:
        task = self._selected()
        if task is not None and await task_action(self.dash, "archive", task):
            await self.reload()

    def action_delete(self) -> None:
        task = self._selected()
        if task is None:
            return

        async def confirmed(yes: bool | None) -> None:
            if yes and await task_action(self.dash, "delete", task):
                await self.reload()

        self.app.push_screen(ConfirmScreen(f"Delete task {task.id}?"), confirmed)


async def task_action(app: DashApp, action: str, task: TaskInfo) -> bool:
    """Run, archive or delete *task*; notifies the outcome and returns whether it worked."""
    insp = app.inspector
    ops = {
        "run": (insp.run_task, "moved to pending"),
        "archive": (insp.archive_task, "archived"),
        "delete": (insp.delete_task, "deleted"),
    }
    fn, done = ops[action]
    ok, _ = await app.attempt(fn(task.queue, task.id))
    if ok:
        app.notify(f"Task {task.id} {done}")
    return ok


class TaskScreen(RefreshingScreen):
    """Every detail of one task."""

    BINDINGS = [  # noqa: RUF012
        Binding("q,escape", "back", "Back"),
        Binding("r", "run", "Run"),
        Binding("a", "archive", "Archive"),
        Binding("d", "delete", "Delete"),
    ]

    def __init__(self, queue: str, task_id: str) -> None:
        super().__init__()
        self.queue = queue
        self.task_id = task_id
        self.info: TaskInfo | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"Task {self.task_id}", id="details", markup=False)
        yield Footer()

    async def load(self) -> None:
        details = self.query_one("#details", Static)
        try:
            self.info = await self.dash.inspector.get_task(self.queue, self.task_id)
        except TaskNotFoundError:
            self.info = None
            details.update(f"Task {self.task_id} no longer exists in queue {self.queue}.")
            return
        except (AsyncqError, RedisError, OSError) as exc:
            self.dash.notify(str(exc), severity="error")
            return
        details.update(task_text(self.info))

    def action_back(self) -> None:
        self.app.pop_screen()

    async def action_run(self) -> None:
        if self.info is not None and await task_action(self.dash, "run", self.info):
            await self.reload()

    async def action_archive(self) -> None:
        if self.info is not None and await task_action(self.dash, "archive", self.info):
            await self.reload()

    def action_delete(self) -> None:
        info = self.info
        if info is None:
            return

        async def confirmed(yes: bool | None) -> None:
            if yes and await task_action(self.dash, "delete", info):
                self.app.pop_screen()

        self.app.push_screen(ConfirmScreen(f"Delete task {info.id}?"), confirmed)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def server_rows(servers: list[ServerInfo], now: datetime) -> list[tuple[str, list[str]]]:
    """One row per server: Host:PID, status, started, busy workers, queues and weights."""
    rows = []
    for s in sorted(servers, key=lambda s: (s.host, s.pid, s.id)):
        queues = ", ".join(f"{q}:{w}" for q, w in sorted(s.queues.items(), key=lambda kv: -kv[1]))
        rows.append(
            (
                s.id,
                [
                    f"{s.host}:{s.pid}",
                    s.status,
                    relative(s.started, now),
                    f"{len(s.active_workers)}/{s.concurrency}",
                    queues + ("  (strict)" if s.strict_priority else ""),
                    s.id,
                ],
            )
        )
    return rows


def worker_rows(servers: list[ServerInfo], now: datetime) -> list[tuple[str, list[str]]]:
    """One row per running task over every server, longest running first."""
    workers = [(s, w) for s in servers for w in s.active_workers]
    far = datetime.max.replace(tzinfo=UTC)
    workers.sort(key=lambda sw: sw[1].started or far)
    return [
        (
            f"{s.id}/{w.task_id}",
            [
                w.task_id,
                w.task_type,
                w.queue,
                relative(w.started, now),
                relative(w.deadline, now),
                f"{s.host}:{s.pid}",
                _short(format_payload(w.task_payload), 60),
            ],
        )
        for s, w in workers
    ]


class ServersScreen(RefreshingScreen):
    """Live worker servers (asyncq and Go asynq) and every task they are running."""

    BINDINGS = [  # noqa: RUF012
        Binding("q,escape", "back", "Back"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("Servers", id="summary")
        servers: DataTable[str] = DataTable(id="servers", cursor_type="row", zebra_stripes=True)
        yield servers
        yield Static("[b]Running tasks[/b]", id="workers-title")
        workers: DataTable[str] = DataTable(id="workers", cursor_type="row", zebra_stripes=True)
        yield workers
        yield Static("", id="status")
        yield Footer()

    def setup(self) -> None:
        self.query_one("#servers", DataTable).add_columns(
            "Host:PID", "Status", "Started", "Busy", "Queues (weight)", "Server ID"
        )
        self.query_one("#workers", DataTable).add_columns(
            "Task ID", "Type", "Queue", "Started", "Deadline", "Server", "Payload"
        )
        self.query_one("#servers", DataTable).focus()

    async def load(self) -> None:
        ok, servers = await self.dash.attempt(self.dash.inspector.servers())
        if not ok or servers is None:
            return
        now = datetime.now(UTC)
        table = self.query_one("#servers", DataTable)
        self.fill(table, server_rows(servers, now), self.selected_key(table))
        workers = self.query_one("#workers", DataTable)
        self.fill(workers, worker_rows(servers, now), self.selected_key(workers))
        busy = sum(len(s.active_workers) for s in servers)
        slots = sum(s.concurrency for s in servers)
        self.query_one("#summary", Static).update(
            f"[b]Servers[/b] ({len(servers)})   running {busy} of {slots} worker slots"
        )
        self.query_one("#status", Static).update(
            f"updated {now.strftime('%H:%M:%S')} UTC"
            + ("" if servers else "; no live server (a server shows up while it heartbeats)")
        )

    def action_back(self) -> None:
        self.app.pop_screen()


def entry_rows(entries: list[SchedulerEntry], now: datetime) -> list[tuple[str, list[str]]]:
    """One row per periodic task: spec, type, payload, options, next and previous enqueue."""
    return [
        (
            e.id,
            [
                e.spec,
                e.task_type,
                _short(format_payload(e.task_payload), 40),
                ", ".join(e.options),
                relative(e.next, now),
                relative(e.prev, now) if e.prev else "never",
                e.id,
            ],
        )
        for e in sorted(entries, key=lambda e: (e.next or datetime.max.replace(tzinfo=UTC), e.id))
    ]


class SchedulersScreen(RefreshingScreen):
    """Periodic task entries of the live schedulers; Enter shows an entry's recent enqueues."""

    BINDINGS = [  # noqa: RUF012
        Binding("q,escape", "back", "Back"),
        Binding("enter", "history", "History"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.entry_id: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("Schedulers", id="summary")
        entries: DataTable[str] = DataTable(id="entries", cursor_type="row", zebra_stripes=True)
        yield entries
        yield Static("", id="history-title")
        history: DataTable[str] = DataTable(id="history", cursor_type="row", zebra_stripes=True)
        yield history
        yield Static("", id="status")
        yield Footer()

    def setup(self) -> None:
        self.query_one("#entries", DataTable).add_columns(
            "Spec", "Type", "Payload", "Options", "Next", "Previous", "Entry ID"
        )
        self.query_one("#history", DataTable).add_columns("Enqueued", "Task ID")
        self.query_one("#entries", DataTable).focus()

    async def load(self) -> None:
        insp = self.dash.inspector
        ok, entries = await self.dash.attempt(insp.scheduler_entries())
        if not ok or entries is None:
            return
        now = datetime.now(UTC)
        table = self.query_one("#entries", DataTable)
        self.fill(table, entry_rows(entries, now), self.selected_key(table))
        self.query_one("#summary", Static).update(f"[b]Schedulers[/b]   {len(entries)} entries")
        history = self.query_one("#history", DataTable)
        if self.entry_id is not None:
            ok, events = await self.dash.attempt(
                insp.scheduler_enqueue_events(self.entry_id, size=PAGE_SIZE)
            )
            rows = [
                (f"{i}:{e.task_id}", [relative(e.enqueued_at, now), e.task_id])
                for i, e in enumerate(events or [])
            ]
            self.fill(history, rows, self.selected_key(history))
            self.query_one("#history-title", Static).update(
                f"[b]Recent enqueues of {self.entry_id}[/b] ({len(rows)} shown)"
            )
        self.query_one("#status", Static).update(
            f"updated {now.strftime('%H:%M:%S')} UTC"
            + ("; Enter shows an entry's recent enqueues" if entries else "; no live scheduler")
        )

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.data_table.id == "entries":
            await self.action_history()

    async def action_history(self) -> None:
        key = self.selected_key(self.query_one("#entries", DataTable))
        if key is not None:
            self.entry_id = key
            await self.reload()

    def action_back(self) -> None:
        self.app.pop_screen()
