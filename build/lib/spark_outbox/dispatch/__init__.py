"""The hot path: claim, send, record.

The worker and its side tasks, the store (the only code that runs the claim,
record and release SQL, and the owner of its plan-cache policy), the channels
(webhook, SMTP), signing, the SSRF guard, the retry schedule and the maintenance
the worker runs. It stands on the ground floor (``spark_outbox.core``) only.
"""
