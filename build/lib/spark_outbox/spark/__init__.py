"""The Spark side: the outbox sink and its batch commit protocol.

Executor modules (``executor``, ``chunks``, ``checks``, ``preview_tasks``,
``pgbinary``) import nothing heavier than psycopg2, pyarrow and the ground floor;
this file therefore imports nothing either. The sink is ``spark_outbox.spark.sink.OutboxSink``.
"""
