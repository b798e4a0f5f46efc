"""Many gateway processes acting as one: the driver's link to the shared store, its modes,
life and metrics, and the worker siblings of ``serve --workers N``.

The scheduler stays sans-I/O; this package carries its counts to ``store`` and the
store's grants back. May import ``store``, ``core`` and the gateway's root; no sibling.
"""
