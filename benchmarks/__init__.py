"""Benchmarks of asyncq beside its Python peers (arq, saq, streaq, taskiq); see README.md.

This package must stay importable with the standard library alone: the per-system
scripts in ``benchmarks.systems`` run inside each peer's own virtualenv.
"""
