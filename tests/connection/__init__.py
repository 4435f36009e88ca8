"""Connections (asyncq/_redis: URIs, the pipelined transport, pools, Pub/Sub, version check)
on a plain server, a Cluster, Sentinel and TLS."""
