"""The worker (asyncq/_worker: the Server, its processor, roles, leases, limits and
aggregator; asyncq/_service, _signals, _cancel, _batch)."""
