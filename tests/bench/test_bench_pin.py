"""``--pin``: redis-server on one core, every measured process on the others.

Runs a throwaway redis-server (skipped where redis-server is not on PATH or this
process has fewer than two usable cores) and reads the affinity the kernel gives it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import runner

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's affinity calls"),
]


def _usable() -> set[int]:
    return os.sched_getaffinity(0)


def _child_lines(code: str) -> list[str]:
    """What *code* prints, run in a child: pinning is for the rest of a process's life."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()


def test_the_plan_gives_the_server_one_core_and_the_measured_processes_the_rest() -> None:
    if len(_usable()) < 2:
        with pytest.raises(SystemExit, match="--pin needs two usable cores"):
            runner.pin_plan()
        return
    server, measured = runner.pin_plan()
    assert len(server) == 1
    assert server.isdisjoint(measured)
    assert server | measured == _usable()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH")
def test_the_throwaway_server_runs_on_its_core_and_the_runner_keeps_its_own() -> None:
    if len(_usable()) < 2:
        pytest.skip("one usable core")
    own = _usable()
    server, _ = runner.pin_plan()
    with runner.redis_server(None, unix_socket=False, cpus=server) as url:
        assert _usable() == own  # the runner got its cores back once the server started
        resp = runner.Resp(url)
        pid = int(resp.info("server")["process_id"])
        resp.close()
        # every thread of the server, those it started after the fork too
        for tid in os.listdir(f"/proc/{pid}/task"):
            assert os.sched_getaffinity(int(tid)) == server, tid


def test_pin_narrows_this_process_and_the_processes_it_starts_and_records_it() -> None:
    if len(_usable()) < 2:
        pytest.skip("one usable core")
    server, measured = runner.pin_plan()
    code = (
        "import os, sys, subprocess; from benchmarks import runner;"
        f" print(runner.pin({server!r}, {measured!r}));"
        " child = 'import os; print(sorted(os.sched_getaffinity(0)))';"
        " print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True)"
        ".stdout.strip())"
    )
    out = _child_lines(code)
    assert out[0] == repr({"redis-server": sorted(server), "measured": sorted(measured)})
    assert out[1] == repr(sorted(measured))
    assert runner.pin(None, None) is None
    lines = runner.pinned_lines({"pinned": {"redis-server": [0], "measured": [1, 2]}})
    assert lines == ["pinned (--pin): redis-server on CPU 0, every measured process on CPU 1,2"]
    assert runner.pinned_lines({}) == []


def test_pin_refuses_a_given_server() -> None:
    with (
        pytest.raises(SystemExit, match="leave out --redis-url"),
        runner.redis_server("redis://127.0.0.1:6379/0", cpus={0}),
    ):
        pass


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH")
def test_the_measured_server_pins_both_sides_and_records_it_in_the_machine() -> None:
    if len(_usable()) < 2:
        pytest.skip("one usable core")
    server, measured = runner.pin_plan()
    code = (
        "import os; from benchmarks import runner\n"
        "for pin_mode in (None, 'apart', 'shared'):\n"
        "    with runner.measured_server(None, pin_mode=pin_mode, unix_socket=False)"
        " as (url, machine):\n"
        "        resp = runner.Resp(url); pid = int(resp.info('server')['process_id']);"
        " resp.close()\n"
        "        print(machine.get('pinned'), sorted(os.sched_getaffinity(0)),"
        " sorted(os.sched_getaffinity(pid)), machine['cpus_usable'])\n"
        f"    os.sched_setaffinity(0, {_usable()!r})\n"
    )  # the cores given back between modes
    out = _child_lines(code)
    everything = sorted(_usable())
    assert out[0] == f"None {everything} {everything} {len(everything)}"
    apart = {"redis-server": sorted(server), "measured": sorted(measured)}
    # the machine's usable cores are read before this process is narrowed
    assert out[1] == f"{apart} {sorted(measured)} {sorted(server)} {len(everything)}"
    shared = {"redis-server": sorted(server), "measured": sorted(server)}
    assert out[2] == f"{shared} {sorted(server)} {sorted(server)} {len(everything)}"


def test_shared_puts_the_measured_processes_on_the_server_s_core_and_says_so() -> None:
    server, measured = runner.pin_plan("shared")
    assert server == measured == {min(_usable())}
    lines = runner.pinned_lines({"pinned": {"redis-server": [0], "measured": [0]}})
    assert lines == [
        "pinned (--pin shared): redis-server and every measured process on CPU 0, so no client"
        " pays to be woken on a core of its own (see benchmarks/README.md)"
    ]
    with pytest.raises(SystemExit, match="--pin is one of apart, shared, not 'near'"):
        runner.pin_plan("near")
    assert runner.parse_args(["--pin"]).pin == "apart"
    assert runner.parse_args(["--pin", "shared"]).pin == "shared"
    assert runner.parse_args([]).pin is None
