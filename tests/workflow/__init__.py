"""Workflows (asyncq/_producer/workflow, asyncq/_broker/workflow and their scripts): chains,
chords, handles, listing."""
