"""The test suite, a package so that harness modules shared between directories are imported
by their package path (``from tests.gateway.gateway_harness import ...``) from anywhere.

pytest finds the repository root as the first directory above a test module without an
``__init__.py`` and puts it on ``sys.path`` (its default ``prepend`` import mode), so no test
edits ``sys.path`` itself.
"""
