"""``asyncq dev`` on another port keeps its own data, and a port held by a program that
is not a Redis gets a hint (issue 41, item 12)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from asyncq.cli import main
from asyncq.cli.dev import default_data_dir
from asyncq.devserver import free_port
from tests.support.procs import ROOT


def test_each_port_has_its_own_default_data_directory(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path)}
    old = os.environ.get("XDG_DATA_HOME")
    os.environ.update(env)
    try:
        assert default_data_dir() == tmp_path / "asyncq" / "dev"  # 6379: where it always was
        assert default_data_dir(6379) == tmp_path / "asyncq" / "dev"
        assert default_data_dir(6400) == tmp_path / "asyncq" / "dev-6400"
    finally:
        if old is None:
            del os.environ["XDG_DATA_HOME"]
        else:
            os.environ["XDG_DATA_HOME"] = old


def test_asyncq_dev_on_another_port_says_its_own_data_directory(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "dev", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip().endswith(f"on redis://127.0.0.1:{port}/0")
        data = proc.stdout.readline().strip()
        assert data.startswith(f"data:  {tmp_path / 'asyncq' / f'dev-{port}'} "), data
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and f"data kept in {tmp_path / 'asyncq' / f'dev-{port}'}" in out


def test_a_port_held_by_another_program_gets_a_hint(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(main, ["dev", "--port", str(port), "--data-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(
        f"error: port {port} on 127.0.0.1 is held by a program that is not a Redis (it does "
        "not answer PING): stop it, or pick another port with --port N"
    )
    assert f"`ss -ltnp 'sport = :{port}'`" in result.stderr
