"""The producer side (asyncq/_producer: Client, compose, the fast path, completion;
asyncq/sync: SyncClient)."""
