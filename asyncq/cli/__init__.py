"""The ``asyncq`` command line: inspect and steer queues, run workers, watch a dashboard.

``main`` is the click group behind the ``asyncq`` console script (and
``python -m asyncq.cli``). Every failure is reported as one ``error: ...`` line
on stderr with a non-zero exit status, never a traceback.
"""

from __future__ import annotations

from asyncq.cli import dev, durable, events, limits, metrics, triage, web, workflow
from asyncq.cli._app import main
from asyncq.cli._commands import register
from asyncq.cli.gateway import gateway
from asyncq.cli.worker import worker

__all__ = ["main"]

register(main)
main.add_command(worker)
main.add_command(gateway)
web.register(main)
limits.register(main)
workflow.register(main)
durable.register(main)
triage.register(main)
events.register(main)
dev.register(main)
metrics.register(main)
