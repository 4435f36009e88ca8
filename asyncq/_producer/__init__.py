"""The producer side: what a Client does to put tasks (and workflows) in Redis and wait for them.

Private: users import :class:`asyncq.Client` and the workflow builders from :mod:`asyncq`.
"""
