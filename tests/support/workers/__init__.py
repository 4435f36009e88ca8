"""The scripts the tests run as worker subprocesses (started by tests/support/procs.py)."""
