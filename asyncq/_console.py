"""The ``asyncq`` console script.

The command line takes about a second to import on a small machine. A Ctrl-C in that
second ends the process as one during a command does, with ``error: interrupted`` and
status 130, instead of the interpreter's ``KeyboardInterrupt`` traceback. ``import asyncq`` is
light (its names load on first use), so almost all of the start-up is inside the guard.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    try:
        from asyncq.cli import main as command_line
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    command_line()
