"""``python -m asyncq.cli`` runs the same command group.

Run as a real subprocess: pytest 9.2's assertion-rewriting import hook has no
``get_code``, so ``runpy.run_module`` inside the test process fails before the CLI runs.
"""

from __future__ import annotations

import subprocess
import sys


def test_module_entry_point_runs_the_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "asyncq.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and "queue" in proc.stdout and "task" in proc.stdout
