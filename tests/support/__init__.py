"""What the tests share and are not tests themselves: fake servers, daemons, fake scripts and tools,
the store conformance suites, PostgreSQL fixtures.

Importable as ``support.*`` because ``tests/`` is on ``sys.path`` (pytest puts it there for the
rootdir conftest; subprocesses get ``PYTHONPATH=src:tests``).
"""
