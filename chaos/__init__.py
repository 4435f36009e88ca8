"""Chaos suite: asyncq under worker crashes, Redis restarts, partitions and failovers.

``python -m chaos`` (or ``nox -s chaos``) starts real ``redis-server``
processes and asyncq worker subprocesses, injects one kind of failure per
scenario, and ends each scenario with the same ledger check: every task a
producer was told was enqueued ran to completion at least once, nothing is
left pending, active or leased, and every duplicate run is explained by a
fault (the earlier run was in flight on a worker that was killed, cut off or
stalled, or its outcome was written around a Redis crash or failover). The
ledger is written by the handlers into a separate Redis, never the one under
test. ``--quick`` runs every scenario with CI-sized durations.
"""
