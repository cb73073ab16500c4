"""Development tools of the command line, the demo, the tests and the benches.

None of this is the outbox: a private PostgreSQL cluster started from the
machine's binaries, a reference webhook receiver and an SMTP mail catcher to
try an integration against, scratch databases and free ports, a bulk loader of
synthetic effects. Nothing in ``dispatcher``, ``api`` or ``spark_jobs`` imports it.
"""
