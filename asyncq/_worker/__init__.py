"""The worker: :class:`asyncq.Server` (``server.py``), its roles (processor, heartbeater,
recoverer, ...) and their primitives (leases, slots, limits, the result writer).

Private: users import :class:`asyncq.Server` from :mod:`asyncq`.
"""
