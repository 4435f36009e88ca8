"""The project as a newcomer meets it: README and docs snippets, the examples, packaging."""
