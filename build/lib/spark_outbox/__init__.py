"""spark-outbox: a transactional outbox and side-effect dispatcher for Spark pipelines.

The one import namespace of the installed distribution. In the repository its
sub-packages are the card's folders, linked here:

- ``core``      (dispatcher/core)     the ground floor: schema, contract, keys, enqueue
- ``dispatch``  (dispatcher/dispatch) the hot path: worker, store, channels
- ``console``   (dispatcher/console)  read models and operator writes
- ``api``       (api)                 the HTTP API and the support page
- ``spark``     (spark_jobs/spark)    the Spark sink and its commit protocol
- ``billing``   (spark_jobs/billing)  the example job
- ``migrations`` (migrations)         Alembic
- ``cli``       (cli)                 the ``outbox`` command line and its tools
"""
