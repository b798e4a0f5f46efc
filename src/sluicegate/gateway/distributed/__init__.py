"""Distributed mode's I/O: the driver's link to the shared store, its modes, life and metrics.

The scheduler stays sans-I/O; this package carries its counts to ``store`` and the
store's grants back. May import ``store`` and ``core``; not ``gateway.request``.
"""
