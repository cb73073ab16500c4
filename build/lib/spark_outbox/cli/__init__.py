"""The ``outbox`` command line: the composition root.

This package only parses arguments and calls into ``dispatcher``, ``spark_jobs``
and ``api``; it is the one place allowed to import all three (see the
import-linter contracts in pyproject.toml).
"""
