"""Worker internals: the server's roles (processor, heartbeater, recoverer, ...) and primitives.

Nothing here is public API; ``asyncq.Server`` builds and runs these roles.
"""
