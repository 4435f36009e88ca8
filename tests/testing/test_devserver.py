"""The local server of ``asyncq dev``, the examples and the test helpers (asyncq.devserver)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as sync_redis
from click.testing import CliRunner, Result

from asyncq import devserver
from asyncq.cli import main
from asyncq.devserver import (
    LocalServer,
    ServerBinary,
    ServerNotFoundError,
    embedded_binary,
    example_redis,
    find_server_binary,
    free_port,
    redis_answers,
)
from tests.support.procs import ROOT

EMBEDDED = embedded_binary()
needs_embedded = pytest.mark.skipif(EMBEDDED is None, reason="the embedded extra is not installed")


@pytest.fixture
def bare_path(tmp_path: Path) -> str:
    """A PATH with this Python and nothing else: no redis-server, no valkey-server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return str(bin_dir)


def _env(path: str, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("ASYNCQ_REDIS_URL", "ASYNCQ_REDIS_SERVER")
    }
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, "PATH": path, "PYTHONPATH": pythonpath, **extra}


# --- which binary ------------------------------------------------------------------------


def test_the_environment_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCQ_REDIS_SERVER", sys.executable)
    found = find_server_binary()
    assert found == ServerBinary(Path(sys.executable), "ASYNCQ_REDIS_SERVER")
    with pytest.raises(ServerNotFoundError, match="not a Redis-compatible server"):
        found.version()


def test_a_missing_executable_in_the_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCQ_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(ServerNotFoundError, match=r"ASYNCQ_REDIS_SERVER=/nonexistent/redis-server"):
        find_server_binary()


def test_path_before_the_embedded_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'Redis server v=7.2.5 sha=0 malloc=libc bits=64'\n")
    fake.chmod(0o755)
    monkeypatch.delenv("ASYNCQ_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    found = find_server_binary()
    assert found == ServerBinary(fake, "PATH")
    assert found.version() == "Redis 7.2.5"


@needs_embedded
def test_the_embedded_binary_when_path_has_none(
    monkeypatch: pytest.MonkeyPatch, bare_path: str
) -> None:
    monkeypatch.delenv("ASYNCQ_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", bare_path)
    found = find_server_binary()
    assert found.source == "asyncq[embedded]"
    assert found.path == EMBEDDED
    assert re.fullmatch(r"Valkey \d+\.\d+\.\d+", found.version())


def test_nothing_found_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, bare_path: str) -> None:
    monkeypatch.delenv("ASYNCQ_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", bare_path)
    monkeypatch.setattr(devserver, "_EMBEDDED_PACKAGE", "no_such_package_here")
    with pytest.raises(ServerNotFoundError) as err:
        find_server_binary()
    message = str(err.value)
    assert "pip install 'asyncq[embedded]'" in message
    assert "redis-server on PATH" in message and "ASYNCQ_REDIS_SERVER" in message


def test_the_test_server_names_the_ways_to_get_one(
    monkeypatch: pytest.MonkeyPatch, bare_path: str
) -> None:
    """asyncq.testing's RedisServerProcess (the pytest plugin's server) adds the way out
    that only tests have: a Redis URL they may flush."""
    from asyncq.testing import RedisServerProcess

    monkeypatch.delenv("ASYNCQ_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", bare_path)
    monkeypatch.setattr(devserver, "_EMBEDDED_PACKAGE", "no_such_package_here")
    with pytest.raises(RuntimeError) as err:
        RedisServerProcess()
    assert "pip install 'asyncq[embedded]'" in str(err.value)
    assert str(err.value).endswith(
        "or point the tests at a Redis you can flush with ASYNCQ_PYTEST_REDIS_URL"
    )
    with pytest.raises(
        RuntimeError, match=r"^no-such-redis-server is not on PATH: .*ASYNCQ_PYTEST_REDIS_URL$"
    ):
        RedisServerProcess("no-such-redis-server")


# --- LocalServer -------------------------------------------------------------------------


def test_throwaway_server_is_removed_on_stop() -> None:
    server = LocalServer().start()
    try:
        assert redis_answers("127.0.0.1", server.port)
        assert server.dir.is_dir()
    finally:
        server.stop()
    assert not redis_answers("127.0.0.1", server.port)
    assert not server.dir.exists()


def test_a_taken_port_is_refused() -> None:
    with LocalServer() as first, pytest.raises(RuntimeError, match="already in use"):
        LocalServer(port=first.port).start()


def test_a_picked_port_taken_before_the_start_is_replaced() -> None:
    with LocalServer() as first:
        second = LocalServer()
        second.port = first.port  # as if another process bound the picked port meanwhile
        with second:
            assert second.port != first.port
            assert redis_answers("127.0.0.1", second.port)
            # Once started, the port stays: a restart comes back where clients look.
            port = second.port
            second.stop()
            second.start()
            assert second.port == port
            assert redis_answers("127.0.0.1", port)


def test_persistent_server_keeps_its_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with LocalServer(data_dir=data) as server:
        r = sync_redis.Redis.from_url(server.url)
        r.rpush("kept", b"a", b"b")
        r.close()
    assert data.is_dir()
    with LocalServer(data_dir=data) as again:
        r = sync_redis.Redis.from_url(again.url)
        assert r.lrange("kept", 0, -1) == [b"a", b"b"]
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        r.close()


def test_a_server_that_exits_at_start_reports_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exited early: .*no-such-option"):
        LocalServer(extra_args=["--no-such-option", "1"]).start()


# --- example_redis -----------------------------------------------------------------------


def test_example_redis_takes_the_environment_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCQ_REDIS_URL", "redis://example.invalid:1/3")
    with example_redis() as url:
        assert url == "redis://example.invalid:1/3"


def test_example_redis_uses_a_redis_that_answers(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ASYNCQ_REDIS_URL", raising=False)
    with example_redis(local_url=redis_url) as url:
        assert url == redis_url
    assert capsys.readouterr().err == ""


def test_example_redis_starts_one_when_nothing_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ASYNCQ_REDIS_URL", raising=False)
    unused = f"redis://127.0.0.1:{free_port()}/0"
    with example_redis(local_url=unused) as url:
        assert url != unused
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert redis_answers("127.0.0.1", port)
    assert not redis_answers("127.0.0.1", port)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"no Redis at {unused}: started ") and url in lines[0]


# --- asyncq dev --------------------------------------------------------------------------


def _start_dev(env: dict[str, str], data: Path) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "dev", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    match = re.search(r"on (redis://127\.0\.0\.1:\d+/0)$", first.strip())
    assert match, (first, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return proc, match.group(1), first


@pytest.fixture
def dev_procs() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.subprocess
@needs_embedded
def test_asyncq_dev_survives_a_restart_and_stops_on_ctrl_c(
    tmp_path: Path, bare_path: str, dev_procs: list[subprocess.Popen[str]]
) -> None:
    env = _env(bare_path)
    data = tmp_path / "dev-data"
    proc, url, first = _start_dev(env, data)
    dev_procs.append(proc)
    assert "(asyncq[embedded])" in first and first.startswith("asyncq dev: Valkey ")
    r = sync_redis.Redis.from_url(url)
    r.set("survives", b"restart")
    r.close()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"stopped; data kept in {data}" in out
    assert "Traceback" not in err and not redis_answers("127.0.0.1", int(url.split(":")[2][:-2]))
    assert list((data / "appendonlydir").iterdir())

    again, url2, _ = _start_dev(env, data)
    dev_procs.append(again)
    r = sync_redis.Redis.from_url(url2)
    assert r.get("survives") == b"restart"
    r.close()
    again.send_signal(signal.SIGTERM)
    out, _ = again.communicate(timeout=30)
    assert again.returncode == 0 and "stopped" in out


def _dev_refused(args: list[str], env: dict[str, str | None] | None = None) -> Result:
    """``asyncq dev ARGS`` in this process: the refusals below end before any server
    runs, so a subprocess would add only its start-up."""
    result = CliRunner().invoke(main, ["dev", *args], env=env)
    # SystemExit: the CLI's own exit, not an exception that escaped it
    assert isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert result.exit_code == 1, result.output
    return result


def test_asyncq_dev_refuses_a_port_where_redis_answers(redis_url: str, tmp_path: Path) -> None:
    port = redis_url.split(":")[2].split("/", maxsplit=1)[0]
    result = _dev_refused(["--port", port, "--data-dir", str(tmp_path)])
    assert result.stderr.startswith(f"error: a Redis already answers on 127.0.0.1:{port}: use it")


# --- README's main job where nothing listens on 6379 and no redis-server is installed ------


def _netns_works() -> bool:
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return False
    probe = subprocess.run(
        [unshare, "-n", ip, "link", "set", "lo", "up"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.subprocess
@needs_embedded
@pytest.mark.skipif(not _netns_works(), reason="needs unshare -n (root) for a private loopback")
def test_main_job_starts_the_embedded_server_when_nothing_answers(bare_path: str) -> None:
    # A network namespace of its own: its 127.0.0.1:6379 is free even where a Redis runs.
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    assert unshare is not None and ip is not None
    script = f"{ip} link set lo up && exec {sys.executable} {ROOT / 'examples' / 'main_job.py'}"
    result = subprocess.run(
        [unshare, "-n", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        env=_env(bare_path),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("no Redis at redis://127.0.0.1:6379/0: started Valkey ")
    assert "(asyncq[embedded])" in lines[0]
    assert "made 12 thumbnails" in result.stdout and "wrote 8 welcome emails" in result.stdout


def test_asyncq_dev_names_a_missing_server_binary(tmp_path: Path) -> None:
    env = {"ASYNCQ_REDIS_SERVER": str(tmp_path / "no-such-server")}
    result = _dev_refused(["--port", "0", "--data-dir", str(tmp_path)], env)
    assert f"ASYNCQ_REDIS_SERVER={tmp_path / 'no-such-server'}" in result.stderr
    assert "Traceback" not in result.stderr


def test_asyncq_dev_reports_a_server_that_fails_to_start(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    # answers --version like a Redis, then exits at once when started as a server
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Redis server v=7.2.5 sha=0 bits=64"; exit 0; fi\n'
        "echo 'fatal: cannot start' >&2\nexit 3\n"
    )
    fake.chmod(0o755)
    env = {"ASYNCQ_REDIS_SERVER": str(fake)}
    result = _dev_refused(["--port", "0", "--data-dir", str(tmp_path)], env)
    assert "exited early" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.subprocess
def test_asyncq_dev_says_when_its_server_exits_and_keeps_data_under_xdg(
    tmp_path: Path, dev_procs: list[subprocess.Popen[str]]
) -> None:
    xdg = tmp_path / "xdg"
    env = _env(os.environ["PATH"], XDG_DATA_HOME=str(xdg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "dev", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    dev_procs.append(proc)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    match = re.search(r"on (redis://127\.0\.0\.1:\d+/0)$", first.strip())
    assert match, first
    assert proc.stdout.readline().strip().startswith(f"data:  {xdg / 'asyncq' / 'dev'}")
    r = sync_redis.Redis.from_url(match.group(1))
    with contextlib.suppress(sync_redis.ConnectionError):
        r.shutdown(nosave=True)  # the server goes away under asyncq dev
    r.close()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "the server exited (status" in err and "Traceback" not in err


def _running(pid: int) -> bool:
    """Whether *pid* is a live process (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.subprocess
@needs_embedded
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_asyncq_dev_killed_takes_its_server_along(
    tmp_path: Path, bare_path: str, dev_procs: list[subprocess.Popen[str]]
) -> None:
    proc, url, _ = _start_dev(_env(bare_path), tmp_path / "dev-data")
    dev_procs.append(proc)
    port = int(url.split(":")[2][:-2])
    r = sync_redis.Redis.from_url(url)
    server_pid = int(r.info("server")["process_id"])
    r.close()
    try:
        proc.kill()  # SIGKILL: no handler of asyncq dev runs
        proc.wait()
        deadline = time.monotonic() + 30
        while _running(server_pid) or redis_answers("127.0.0.1", port):
            assert time.monotonic() < deadline, "the server outlived asyncq dev"
            time.sleep(0.05)
    finally:
        if _running(server_pid):
            os.kill(server_pid, signal.SIGKILL)
