"""Benchmarks of asyncq beside arq, saq, streaq, taskiq and BullMQ (Python, Node); see README.md.

This package must stay importable with the standard library alone: the per-system
scripts in ``benchmarks.systems`` run inside each peer's own virtualenv.
"""
