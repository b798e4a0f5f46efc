"""The embedded batch backend: one SQLite file (WAL) behind ``SqliteBatches``."""
