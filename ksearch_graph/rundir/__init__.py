"""Run directories: the folder one search lives in (run.json, checkpoints, store.sqlite, the task copy), its
writer lock, its integrity checks, recovery from its store, and read-only access for readers."""
