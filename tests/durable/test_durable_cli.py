"""``asyncq durable ls|inspect|cancel|signal`` against runs waiting on an in-process
worker: once through the console entry point (``python -m asyncq.cli``), else through
click's runner in a thread (the command runs its own event loop)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from click.testing import CliRunner

from asyncq import DurableRunNotFoundError, Inspector, Server
from asyncq.cli import main
from tests.support import durable_app as d
from tests.support.helpers import wait_until

Q = d.QUEUE


async def cli(redis_url: str, *args: str) -> tuple[int, str, str]:
    runner = CliRunner(env={"COLUMNS": "200", "ASYNCQ_REDIS_URL": None})
    result = await asyncio.to_thread(
        runner.invoke, main, ["-u", redis_url, *args], catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


async def entry_point(redis_url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncq.cli", "-u", redis_url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},  # tables as wide as their rows
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_ls_inspect_signal_and_cancel(redis_url: str, worker: Server) -> None:
    first = await d.waiter.start("a", None)
    second = await d.fickle.start()

    async def waits(run_id: str) -> bool:
        async with Inspector(redis_url) as insp:
            try:
                wait = (await insp.get_durable_run(Q, run_id)).waiting_for
                return wait is not None and wait.kind == "signal"  # not a step's wait
            except DurableRunNotFoundError:
                return False

    await wait_until(lambda: waits(first.id), what="the waiter waits")
    await wait_until(lambda: waits(second.id), what="the fickle run waits")

    code, out, _ = await entry_point(redis_url, "durable", "ls", "-q", Q, "--json")
    assert code == 0
    rows = {r["id"]: r for r in json.loads(out)["runs"]}
    assert rows[first.id]["waiting_for"]["signal_name"] == "go"
    assert rows[second.id]["type"] == "d:fickle" and rows[second.id]["steps_done"] == 1

    code, out, _ = await cli(redis_url, "durable", "ls")
    assert code == 0 and first.id in out and "signal go / a" in out

    code, out, _ = await cli(redis_url, "durable", "inspect", second.id, "-q", Q)
    assert code == 0, out
    assert "State:      waiting" in out and 'step d:add {"a":2,"b":3}' in out
    assert "(waiting)" in out  # the wait for fickle/k
    code, out, _ = await cli(redis_url, "durable", "inspect", second.id, "-q", Q, "--json")
    assert [e["result"] for e in json.loads(out)["entries"]] == ["5", None]

    code, out, _ = await cli(
        redis_url, "durable", "signal", "go", "-q", Q, "-k", "a", "-p", '{"x": 1}'
    )
    assert (code, out.strip()) == (0, "Signal 'go' taken by 1 run")
    assert await first.result(timeout=20) == {"got": {"x": 1}}

    code, out, _ = await cli(redis_url, "durable", "cancel", second.id, "-q", Q)
    assert (code, out.strip()) == (0, f"Durable run {second.id} cancelled")
    code, out, _ = await cli(redis_url, "durable", "cancel", second.id, "-q", Q)
    assert out.strip() == f"Durable run {second.id} was already cancelled; nothing changed"

    # bad input: one clear error line, no traceback
    for args, said in (
        (("inspect", "nope", "-q", Q), "error: durable run not found: id='nope'"),
        (("inspect", "a}b", "-q", Q), "error: run ID 'a}b' holds"),
        (("cancel", "x", "-q", "nosuch"), "error: queue not found: 'nosuch'"),
        (("signal", "go", "-q", Q, "-p", "{bad"), "--payload"),
    ):
        code, out, err = await cli(redis_url, "durable", *args)
        assert code != 0 and said in err and "Traceback" not in err, (args, err)


async def test_a_run_not_attempted_yet_is_listed_inspected_and_cancelled(
    redis_url: str, app: None
) -> None:
    handle = await d.chain3.start(4)  # no worker: it waits for its first attempt
    code, out, _ = await cli(redis_url, "durable", "ls", "-q", Q, "--json")
    assert code == 0
    assert [(r["id"], r["state"]) for r in json.loads(out)["runs"]] == [(handle.id, "pending")]
    code, out, _ = await cli(redis_url, "durable", "inspect", handle.id, "-q", Q)
    assert code == 0 and "State:      pending" in out and "Function:   d:chain" in out
    code, out, _ = await cli(redis_url, "durable", "cancel", handle.id, "-q", Q)
    assert (code, out.strip()) == (0, f"Durable run {handle.id} cancelled")
