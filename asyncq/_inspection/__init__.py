"""Inspection: reading and administering queues, tasks, servers, schedulers and workflows.

Private: users import :class:`asyncq.Inspector` and its records from :mod:`asyncq`.
"""
