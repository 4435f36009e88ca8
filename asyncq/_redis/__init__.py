"""The Redis connection: URI options, redis-py clients, the pipelined transport and Lua scripts."""
