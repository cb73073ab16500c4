"""The example job: usage events -> per-customer per-day invoices and their effects.

Not part of the sink library: it shows how a job uses it (``job`` transforms,
``run`` is the entry point, ``schema`` its results table, ``generate`` its input).
"""
