"""Prometheus metrics and the metrics history (asyncq/metrics, asyncq/history)."""
