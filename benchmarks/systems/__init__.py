"""One script per system; each runs in that system's own environment (see ``_common``).

``bullmq_node`` drives BullMQ for Node, which runs in ``benchmarks/node/bench.mjs``.
"""
