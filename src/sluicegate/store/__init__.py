"""The shared store of distributed mode: plain data in ``types``, Redis in ``redis_store``.

Import from the submodules: this package imports nothing itself, so ``types``
stays importable without redis-py.
"""
