"""The console: read models and operator writes, for the API and the command line.

Audit search, status and health, filters, reconciliation, held batches,
rejects, uncertain sends, tokens and administration; every write is audited. It
stands on the ground floor (``spark_outbox.core``) only, never on the hot path.
"""
