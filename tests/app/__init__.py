"""The application surface (asyncq/app, task, mux, errors, hooks, lifespan, otel; the lazy
top-level names and the console script)."""
