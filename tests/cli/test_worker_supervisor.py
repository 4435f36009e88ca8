"""``asyncq worker --processes N``: a supervisor of real worker processes, driven by signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis

from asyncq.cli.supervisor import watch_supervisor

ROOT = Path(__file__).resolve().parents[2]

APP = """
import os
from redis.asyncio import Redis
from asyncq import ServeMux

mux = ServeMux()

@mux.handler("slow")
async def slow(task):
    # No read timeout: redis-py 8's default (5 s) would end the BLPOP below on a slow run.
    async with Redis.from_url(os.environ["TEST_REDIS_URL"], socket_timeout=None) as r:
        await r.rpush("started", f"{os.getpid()}:{task.payload.decode()}")
        await r.blpop(["release"])  # runs until the test pushes one "release" per task
        await r.rpush("handled", task.payload)
"""

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("supervisor")]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "slowapp.py").write_text(APP)
    return tmp_path


def start_supervisor(redis_url: str, app_dir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "-u", redis_url, "worker", "slowapp:mux", *args],
        cwd=app_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(what: str, predicate: Callable[[], Any], proc: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + 45
    while True:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"supervisor exited ({proc.returncode}) before {what}: {proc.stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def server_pids(r: sync_redis.Redis) -> set[int]:
    """Pids of the servers whose info is in Redis (asynq:servers:{host:pid:id})."""
    pids = set()
    for member in r.zrange("asynq:servers", 0, -1):
        _host, pid, _id = member.decode().rsplit("{", 1)[1].rstrip("}").rsplit(":", 2)
        if r.exists(member):
            pids.add(int(pid))
    return pids


def server_statuses(r: sync_redis.Redis) -> list[str]:
    from asyncq.proto.asynq import ServerInfo

    infos = [r.get(m) for m in r.zrange("asynq:servers", 0, -1)]
    return [ServerInfo.parse(raw).status for raw in infos if raw is not None]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def enqueue(redis_url: str, *payloads: str) -> None:
    import asyncio

    from asyncq import Client, Task

    async def go() -> None:
        async with Client(redis_url) as client:
            for p in payloads:
                await client.enqueue(Task("slow", p.encode()))

    asyncio.run(go())


def end(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Send *sig* to the supervisor and return its stderr once it exited."""
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    return err


def stderr_lines(proc: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """Collect the child's stderr lines as they come, in a thread (join it after the exit)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    return lines, reader


def logged(lines: list[str], text: str) -> int:
    """How many times *text* is in the *lines* read so far. Counted in their whole text:
    the worker processes share the supervisor's stderr, and two of them writing at once
    can put two log lines on one line."""
    return "".join(list(lines)).count(text)


def kill_on_failure(proc: subprocess.Popen[str]) -> None:
    """After a failed test: SIGKILL the supervisor (its workers notice and shut down)."""
    if proc.poll() is None:
        proc.kill()
    _out, err = proc.communicate()
    print(err, file=sys.stderr)


def test_restarts_a_killed_worker_and_drains_all_on_sigterm(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    # A shutdown timeout no test run reaches: the handlers end when the test releases them.
    args = ["--processes", "2", "-c", "2", "--shutdown-timeout", "60s"]
    proc = start_supervisor(redis_url, app_dir, *args)
    lines, reader = stderr_lines(proc)
    try:
        wait_for("two worker processes", lambda: len(server_pids(r)) == 2, proc)
        pids = server_pids(r)
        assert proc.pid not in pids  # the supervisor runs no worker itself

        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        wait_for(
            "a replacement worker process",
            lambda: len((server_pids(r) - {victim}) - pids) == 1 and not alive(victim),
            proc,
        )

        # Tasks in flight on every process when SIGTERM arrives are finished, not dropped.
        enqueue(redis_url, *(f"t{i}" for i in range(4)))
        wait_for("four running tasks", lambda: r.llen("started") == 4, proc)
        running = {int(s.decode().split(":")[0]) for s in r.lrange("started", 0, -1)}
        proc.send_signal(signal.SIGTERM)
        wait_for(
            "both workers to begin their shutdown",
            lambda: logged(lines, "starting graceful shutdown") == 2,
            proc,
        )
        assert r.llen("handled") == 0  # all four still running when the shutdown began
        r.rpush("release", *(["go"] * 4))
        proc.wait(timeout=60)
        reader.join(timeout=30)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        print("".join(lines), file=sys.stderr)
        raise
    err = "".join(lines)
    assert proc.returncode == 0, err
    assert sorted(r.lrange("handled", 0, -1)) == [b"t0", b"t1", b"t2", b"t3"]
    assert r.llen("asynq:{default}:active") == 0 and r.llen("asynq:{default}:pending") == 0
    assert not any(alive(pid) for pid in running)
    # Each drained process removed its records; only the SIGKILLed one's wait for their TTL.
    assert server_pids(r) <= {victim}
    assert "restarting it" in err and "killed by SIGKILL" in err
    assert "Traceback" not in err


def test_sigtstp_is_forwarded_and_sigint_shuts_down(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    args = ["--processes", "2", "--heartbeat-interval", "200ms"]
    proc = start_supervisor(redis_url, app_dir, *args)
    try:
        wait_for("two worker processes", lambda: len(server_pids(r)) == 2, proc)
        proc.send_signal(signal.SIGTSTP)
        # Each worker writes its status with its next heartbeat (every 200 ms here).
        wait_for(
            "both workers to report 'stopped'",
            lambda: server_statuses(r) == ["stopped", "stopped"],
            proc,
        )
        assert proc.poll() is None  # the supervisor itself is not suspended
        enqueue(redis_url, "after-tstp")
        time.sleep(1.5)
        assert r.llen("started") == 0  # stopped workers fetch nothing new
        err = end(proc, signal.SIGINT)
    except BaseException:
        kill_on_failure(proc)
        raise
    assert proc.returncode == 0, err
    # Still there for the next worker: pending, or, when its enqueue delivered it to a
    # worker as that worker stopped (a credit renewed as the stop withdrew it), active
    # under that worker's lease, which the next worker's recoverer takes back (a delivery
    # after the stop is left to its lease: tests/worker/test_delivery_processor.py).
    pending = r.lrange("asynq:{default}:pending", 0, -1)
    leased = r.zrange("asynq:{default}:lease", 0, -1)
    assert len(pending) + len(leased) == 1, (pending, leased)
    assert r.llen("started") == 0  # and it never ran


def test_burst_workers_stay_down_once_the_queues_are_empty(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    enqueue(redis_url, "b1", "b2", "b3")
    r.rpush("release", *(["go"] * 3))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    args = ["worker", "slowapp:mux", "--processes", "2", "--burst", "--log-level", "warning"]
    result = subprocess.run(
        [sys.executable, "-m", "asyncq.cli", "-u", redis_url, *args],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(r.lrange("handled", 0, -1)) == [b"b1", b"b2", b"b3"]
    assert "restarting" not in result.stderr


def test_a_worker_process_shuts_down_when_its_supervisor_is_gone(tmp_path: Path) -> None:
    # A stand-in supervisor starts a child that watches it, then dies with SIGKILL.
    marker, ready = tmp_path / "gone", tmp_path / "ready"
    child = (
        "import os, signal, sys, time\n"
        "from asyncq.cli.supervisor import watch_supervisor\n"
        f"watch_supervisor(os.getppid(), lambda: open({str(marker)!r}, 'w').close(),"
        " interval=0.05)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(30)\n"
    )
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "time.sleep(30)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline, "the child never started watching"
            time.sleep(0.05)
        time.sleep(0.2)
        assert not marker.exists()  # the supervisor is alive: nothing happens
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "the orphaned worker did not notice"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_watch_supervisor_stays_quiet_while_the_supervisor_lives() -> None:
    calls: list[int] = []
    thread = watch_supervisor(os.getppid(), lambda: calls.append(1), interval=0.01)
    time.sleep(0.2)
    assert thread.is_alive() and calls == []


def test_reload_restarts_the_worker_when_code_changes(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    proc = start_supervisor(redis_url, app_dir, "--reload")
    try:
        # The supervisor's watcher task runs before it starts any worker, and watchfiles
        # sets up its watches synchronously in the first step: a running worker means
        # the change below is seen.
        (first,) = wait_for("the worker process", lambda: server_pids(r), proc)
        (app_dir / "slowapp.py").write_text(APP + "\n# changed\n")
        wait_for("a reloaded worker process", lambda: server_pids(r) - {first}, proc)
        wait_for("the old process to exit", lambda: not alive(first), proc)
        err = end(proc, signal.SIGTERM)
    except BaseException:
        kill_on_failure(proc)
        raise
    assert proc.returncode == 0, err
    assert "code changed" in err and "slowapp.py" in err


def test_shutdown_timeout_reaches_the_worker_processes(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    args = ["worker", "slowapp:mux", "--processes", "1", "--shutdown-timeout", "500ms"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "-u", redis_url, *args],
        cwd=app_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("the worker process", lambda: server_pids(r), proc)
        enqueue(redis_url, "long")
        wait_for("the task to start", lambda: r.llen("started") == 1, proc)
        # The handler is never released: the worker exits only by giving up on it.
        err = end(proc, signal.SIGTERM)
    except BaseException:
        kill_on_failure(proc)
        raise
    assert proc.returncode == 0, err
    # Not finished in 500 ms: requeued at the front of its queue, no retry counted.
    assert r.llen("handled") == 0 and r.llen("asynq:{default}:pending") == 1


SLOW_START = """
import asyncio, sys
from datetime import timedelta
from asyncq import Intervals, ServeMux, Server

class SlowStart(Server):
    async def start(self, handler):
        print("starting", flush=True)  # run() has installed its signal handlers by now
        # The test writes a line once it has sent the signal: the signal reaches this
        # (single-threaded) process before the line does, so before the server starts.
        stdin = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        await stdin.readline()
        await super().start(handler)
        print("started", self.state, flush=True)

async def main():
    server = SlowStart(sys.argv[1], intervals=Intervals(heartbeat=timedelta(milliseconds=200)))
    await server.run(ServeMux())
    print("exited", flush=True)

asyncio.run(main())
"""


def next_line(proc: subprocess.Popen[str], prefix: str) -> str:
    """The next stdout line that starts with *prefix* (structlog's lines go there too)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    return ""


@pytest.mark.parametrize("first", [signal.SIGTSTP, signal.SIGTERM], ids=["TSTP", "TERM"])
def test_a_signal_while_the_server_starts_is_handled(
    redis_url: str, r: sync_redis.Redis, first: signal.Signals
) -> None:
    # A supervisor (or systemd, or Kubernetes) may signal a worker that is still starting:
    # SIGTSTP must not suspend it, SIGTERM must not kill it without a shutdown.
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_START, redis_url],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert next_line(proc, "starting") == "starting"
        proc.send_signal(first)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if first == signal.SIGTSTP:
            assert next_line(proc, "started").startswith("started")
            # Not suspended: it runs on, stopped, and says so in its heartbeat (every 200 ms).
            wait_for("the status 'stopped'", lambda: server_statuses(r) == ["stopped"], proc)
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    except BaseException:
        kill_on_failure(proc)
        raise
    assert proc.returncode == 0, err
    assert "exited" in out
    assert r.zcard("asynq:servers") == 0


HINTS = ("send signal TSTP to stop processing new tasks", "send signal TERM or INT to terminate")


def test_the_signal_hints_print_once_with_a_supervisor(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    proc = start_supervisor(redis_url, app_dir, "--processes", "2")
    lines, reader = stderr_lines(proc)
    try:
        # Each worker logs "starting processing" inside start(); a worker that prints
        # the hints does so right after, with its signal handlers already installed.
        wait_for("both workers starting", lambda: logged(lines, "starting processing") == 2, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=30)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise
    assert proc.returncode == 0, "".join(lines)
    for hint in HINTS:
        assert sum(hint in line for line in lines) == 1, (hint, "".join(lines))


def test_burst_mode_prints_no_signal_hints(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    enqueue(redis_url, "b1")
    r.rpush("release", "go")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    for extra in (["--processes", "2"], []):
        args = ["worker", "slowapp:mux", "--burst", *extra]
        result = subprocess.run(
            [sys.executable, "-m", "asyncq.cli", "-u", redis_url, *args],
            cwd=app_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "starting processing" in result.stderr
        assert not any(hint in result.stderr for hint in HINTS), result.stderr
