"""The harnesses the tests share: servers, fakes, fixtures' data, worker processes.

Test files import from here and never from one another; fixtures used everywhere are in
tests/conftest.py.
"""
