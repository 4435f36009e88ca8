"""The task event stream and progress (asyncq/events, asyncq/progress)."""
