"""The command line (asyncq/cli): commands, the dashboard (dash) and the worker supervisor."""
