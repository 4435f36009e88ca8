"""The HTTP enqueue gateway and HTTP-target tasks (asyncq/gateway)."""
