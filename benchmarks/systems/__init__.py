"""One script per system; each runs in that system's own virtualenv (see ``_common``)."""
