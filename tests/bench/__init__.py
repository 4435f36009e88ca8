"""The benchmark harness's own tests (benchmarks/; marked bench: `nox -s benchcheck`, not
the default run)."""
