"""The Inspector and failure triage (asyncq/_inspection, asyncq/_broker/inspect and triage,
asyncq/_errsig), hostile stored data included."""
