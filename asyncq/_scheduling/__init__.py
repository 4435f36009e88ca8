"""The scheduler family: cron specs, the Scheduler that enqueues on them (its heartbeat and
tickers are roles, in ``roles.py``), and the PeriodicTaskManager that keeps a Scheduler
in step with a config provider.

Private: users import :class:`asyncq.Scheduler` and :class:`asyncq.PeriodicTaskManager`
from :mod:`asyncq`.
"""
