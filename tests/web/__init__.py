"""The web UI and its JSON API (asyncq/web), through the ASGI app and in a real browser."""
