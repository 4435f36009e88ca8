"""``asyncq gateway`` writes uvicorn's own lines in asyncq's log format (issue 41,
item 12): one format on the gateway's stderr, not two."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from asyncq.devserver import free_port
from tests.support.procs import ROOT

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[(info|warning|error)\s*\] ")


def test_uvicorn_lines_come_in_asyncq_format(redis_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "-u", redis_url, "gateway",
         "--port", str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.stderr is not None
    lines = []
    try:
        while "startup complete" not in (line := proc.stderr.readline()):
            assert line, "the gateway exited before its startup line"
            lines.append(line.rstrip("\n"))
        lines.append(line.rstrip("\n"))
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    lines += [x for x in rest.splitlines() if x.strip()]
    assert lines[0].startswith("asyncq gateway on http://127.0.0.1:")  # its banner
    logged = lines[1:]
    startup = [x for x in logged if "Application startup complete." in x]
    assert len(startup) == 1 and startup[0].endswith("[uvicorn.error]"), logged
    assert logged and all(LINE.match(x) for x in logged), logged
    assert not [x for x in logged if x.startswith("INFO:")]  # uvicorn's own format
