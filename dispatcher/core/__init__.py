"""The ground floor: what every part of the outbox stands on.

The schema and the current text of its views, functions and triggers; the effect
contract, keys and ``enqueue``; the endpoint registry; connecting, errors,
settings, wake-ups, the audit-log writer, and the masking of what the support
role sees (used by the console's reads, retention's purge and the dispatcher's
errors about URLs). It imports nothing of the hot path (``spark_outbox.dispatch``),
the console (``spark_outbox.console``), the API or Spark.
"""
