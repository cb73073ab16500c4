# One image for every role of spark-outbox: the migrate step, the dispatcher, the
# API, the reference receiver / mail catcher, the Spark driver of the billing job,
# and the Spark master and workers themselves. Running the Spark cluster from the
# same image is deliberate: executors need exactly the driver's PySpark, Python,
# psycopg2 and this package (`spark_outbox.spark` and `spark_outbox.core`), and one
# image is the simplest way to guarantee that.
#
# No secret is baked in: DATABASE_URL carries no password; the password, the
# webhook signing secret and the like arrive at run time as files (compose
# secrets) named by *_FILE variables, exported by docker/entrypoint.sh.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Java for Spark; the PostgreSQL JDBC driver for Spark's JDBC reader/writer.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java procps tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
# spark_outbox/ links the card's folders into the one import namespace.
COPY spark_outbox ./spark_outbox
COPY dispatcher ./dispatcher
COPY spark_jobs ./spark_jobs
COPY api ./api
COPY migrations ./migrations
COPY cli ./cli
RUN pip install '.[spark,api,demo,otel]'

# /data is the compose file's `usage` volume: a new named volume starts as a copy of
# the image's /data, so the billing stream's input and checkpoint directories exist
# before any file arrives (the stream waits for files; a missing --input is an error).
COPY docker/entrypoint.sh /usr/local/bin/outbox-entrypoint
RUN chmod 0755 /usr/local/bin/outbox-entrypoint \
    && useradd --system --create-home --uid 10001 outbox \
    && mkdir -p /data/usage/incoming /data/checkpoints && chown -R outbox /data
USER outbox

# Spark scripts ship inside the pyspark wheel.
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3 \
    OUTBOX_LOG_FORMAT=json
ENV PATH="${SPARK_HOME}/bin:${PATH}"

ENTRYPOINT ["tini", "--", "outbox-entrypoint"]
CMD ["outbox", "--help"]
