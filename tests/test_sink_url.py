"""The sink's and the Spark data source's database URL is checked where it is given,
on the driver, before any batch: a JDBC URL (what a Spark user has at hand) or one of
another database once failed inside the first batch with the driver's traceback."""

from __future__ import annotations

import pytest

from spark_outbox.core.errors import ConfigurationError
from spark_outbox.spark import source_options
from spark_outbox.spark.sink import OutboxSink


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("jdbc:postgresql://db.example.com:5432/app", "is a JDBC URL; drop the jdbc: prefix"),
        ("mysql://u:s3cret@db.example.com/app", "names 'mysql'"),
        ("postgresql://u:s3cret@db.example.com:70000/app", "has port 70000"),
    ],
)
def test_a_url_the_sink_cannot_use_is_refused_when_the_sink_is_made(url: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        OutboxSink(job="billing", database_url=url)
    assert str(refused.value).startswith("database_url ") and said in str(refused.value)
    assert "s3cret" not in str(refused.value)
    with pytest.raises(ConfigurationError) as refused:
        source_options.database_url({"database_url": url})
    assert str(refused.value).startswith("option database_url") and said in str(refused.value)


def test_a_postgresql_url_is_taken_as_it_is() -> None:
    url = "postgresql://outbox@db.example.com:5432/outbox?sslmode=require"
    assert OutboxSink(job="billing", database_url=url).database_url == url
    assert source_options.database_url({"DATABASE_URL": url}) == url
