"""Settings: one object per process, built at the entry point and passed down.

Every setting comes from the environment (``OUTBOX_*``, plus ``DATABASE_URL``);
CLI flags override it. Nothing here is read at import time.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_outbox.core import bounds
from spark_outbox.core.db import check_url, redact
from spark_outbox.core.durations import parse_duration_s
from spark_outbox.core.errors import ConfigurationError, InvalidInput

# Svix's schedule: immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
DEFAULT_RETRY_SCHEDULE_S: tuple[float, ...] = (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
# Svix disables an endpoint after 5 days of failing.
DEFAULT_AUTO_DISABLE_AFTER_S = 5 * 86400.0
# The share of the time a dispatcher's purge works (Settings.retention_pace).
DEFAULT_RETENTION_PACE = 0.25
STATE_DIR_NAME = "spark-outbox"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """One state directory per user, whatever the current directory (XDG base
    directories): ``$XDG_STATE_HOME/spark-outbox``, else ``~/.local/state/spark-outbox``.

    It once followed the current directory (``.outbox``), so a command run from
    another directory silently started a second private cluster and could not
    see the first. The spec ignores a relative ``XDG_STATE_HOME``; so do we.
    """
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / STATE_DIR_NAME
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".local" / "state" / STATE_DIR_NAME


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{name}={raw!r} is not a number; set it to e.g. {default}"
        ) from exc


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{name}={raw!r} is not an integer; set it to e.g. {default}"
        ) from exc


def _env_flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigurationError(f"{name}={raw!r} is not a flag; set it to 1 or 0")


def _env_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = env.get(name, "")
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _env_duration(env: Mapping[str, str], name: str) -> float:
    """A duration such as ``30d``; unset or empty is 0 (off)."""
    raw = env.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        return parse_duration_s(name, raw)
    except InvalidInput as exc:
        raise ConfigurationError(f"{name}={raw!r} is not a duration; set it to e.g. 30d") from exc


def _retry_schedule(env: Mapping[str, str], name: str) -> tuple[float, ...]:
    """Delays within the bounds an endpoint's own schedule has (``bounds``): the
    record turns each into an interval, which 1e308 s would overflow."""
    items = _env_list(env, name)
    if not items:
        return ()  # unset: the default
    try:
        return tuple(bounds.check_retry_schedule([float(x) for x in items]) or ())
    except (ValueError, InvalidInput) as exc:
        problem = exc.problem if isinstance(exc, InvalidInput) else "is not a list of numbers"
        raise ConfigurationError(
            f"{name}={','.join(items)!r}: {problem}; give 1 to {bounds.MAX_RETRIES} delays of "
            f"{bounds.RETRY_DELAY_S.range}, e.g. 0,5,300"
        ) from exc


def _networks(
    env: Mapping[str, str], name: str
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    networks = []
    for item in _env_list(env, name):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ConfigurationError(
                f"{name}: {item!r} is not a network; write CIDR like 127.0.0.0/8 or 10.1.2.0/24"
            ) from exc
    return tuple(networks)


@dataclasses.dataclass(frozen=True)
class Breaker:
    """The circuit breaker's policy (store.sql, ``record``): from the ``failures``-th
    failed attempt in a row an endpoint rests ``base_s``, doubling with every further
    failure, at most ``max_s``; no dispatcher claims for it meanwhile."""

    failures: int = 5
    base_s: float = 1.0
    max_s: float = 60.0

    def params(self) -> dict[str, float]:
        """As the record statement's bind parameters."""
        return {
            "breaker_failures": self.failures,
            "breaker_base_s": self.base_s,
            "breaker_max_s": self.max_s,
        }


DEFAULT_BREAKER = Breaker()

# The breaker's settings are refused outside these (a rest of more than a day is an
# outage, not a pause; below a millisecond it is no rest at all).
BREAKER_MAX_FAILURES = 1000
BREAKER_MIN_S = 0.001
BREAKER_MAX_S = 86400.0


_DAY, _YEAR = 86_400.0, 31_536_000.0
# The least share of the time a purge works (a batch, then a rest 99 times as long);
# retention.check_pace checks the command line's against it too.
MIN_RETENTION_PACE = 0.01


def _check_ranges(s: Settings) -> None:
    """Every number a dispatcher or the API runs on, refused at start outside a range
    that works (NaN and infinity too): a lease of NaN or 1e308 once failed every claim,
    a concurrency of 0 started a worker that never claimed, 99999999999d of retention
    crashed the side task at its first pass, a port of 70000 served on another port."""
    ranges: tuple[tuple[str, float, float, float, str], ...] = (
        ("OUTBOX_CONCURRENCY", s.concurrency, 1, 10_000, "128"),
        ("OUTBOX_CLAIM_BATCH_SIZE", s.claim_batch_size, 1, 10_000, "500"),
        ("OUTBOX_PROCESSES", s.processes, 0, 1024, "0 (one per core)"),
        ("OUTBOX_LEASE_S", s.lease_s, 1, _DAY, "60"),
        ("OUTBOX_POLL_INTERVAL_S", s.poll_interval_s, 0.01, 3600, "1"),
        ("OUTBOX_SHUTDOWN_TIMEOUT_S", s.shutdown_timeout_s, 0, _DAY, "30"),
        ("OUTBOX_HEARTBEAT_INTERVAL_S", s.heartbeat_interval_s, 0.1, 3600, "5"),
        ("OUTBOX_PROGRESS_INTERVAL_S", s.progress_interval_s, 0, _DAY, "30 (0: off)"),
        ("OUTBOX_RETRY_AFTER_CAP_S", s.retry_after_cap_s, 0, 30 * _DAY, "3600"),
        ("OUTBOX_AUTO_DISABLE_AFTER_S", s.auto_disable_after_s, 0, 10 * _YEAR, "0 (off)"),
        ("OUTBOX_RETENTION_OLDER_THAN", s.retention_older_than_s, 0, 100 * _YEAR, "30d"),
        ("OUTBOX_RETENTION_INTERVAL_S", s.retention_interval_s, 0, _YEAR, "3600"),
        (
            "OUTBOX_RETENTION_FORGET_KEYS_AFTER",
            s.retention_forget_keys_after_s,
            0,
            100 * _YEAR,
            "400d",
        ),
        ("OUTBOX_API_PORT", s.api_port, 0, 65_535, "8000"),
    )
    for name, value, low, high, example in ranges:
        if not low <= value <= high:  # NaN fails it too
            unit = "" if name.endswith(("CONCURRENCY", "SIZE", "PROCESSES", "PORT")) else " s"
            raise ConfigurationError(
                f"{name}={value:g}{unit} is out of range; use {low:g} to {high:g}{unit}, "
                f"e.g. {example}"
            )


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _check_logging(s: Settings) -> None:
    if s.log_level.upper() not in LOG_LEVELS:
        raise ConfigurationError(
            f"OUTBOX_LOG_LEVEL={s.log_level!r} (or --log-level) is no log level; use one of "
            f"{', '.join(LOG_LEVELS)}"
        )
    if s.log_format not in ("json", "text"):
        raise ConfigurationError(
            f"OUTBOX_LOG_FORMAT={s.log_format!r} (or --log-format) is no log format; use json"
            " or text"
        )


def _check_lanes(s: Settings) -> None:
    if s.nondedup_concurrency < 1:
        raise ConfigurationError(
            f"OUTBOX_NONDEDUP_CONCURRENCY={s.nondedup_concurrency} must be at least 1, e.g. 4"
        )


def _check_breaker(s: Settings) -> None:
    """Refused at start, not when the first endpoint fails."""
    if not 1 <= s.breaker_failures <= BREAKER_MAX_FAILURES:
        raise ConfigurationError(
            f"OUTBOX_BREAKER_FAILURES={s.breaker_failures} is out of range; "
            f"use 1 to {BREAKER_MAX_FAILURES}, e.g. 5"
        )
    for name, value in (("BASE_S", s.breaker_base_s), ("MAX_S", s.breaker_max_s)):
        if not BREAKER_MIN_S <= value <= BREAKER_MAX_S:  # NaN too
            raise ConfigurationError(
                f"OUTBOX_BREAKER_{name}={value:g} is out of range; use "
                f"{BREAKER_MIN_S:g} to {BREAKER_MAX_S:g} seconds"
            )
    if s.breaker_base_s > s.breaker_max_s:
        raise ConfigurationError(
            f"OUTBOX_BREAKER_BASE_S={s.breaker_base_s:g} is above OUTBOX_BREAKER_MAX_S="
            f"{s.breaker_max_s:g}; lower the first rest or raise the longest"
        )


def _check_trace_url_template(template: str) -> None:
    """A link on the support page: http(s) only (never javascript:), naming the trace."""
    if template and (
        "{trace_id}" not in template or not template.startswith(("https://", "http://"))
    ):
        raise ConfigurationError(
            f"OUTBOX_TRACE_URL_TEMPLATE={template!r}: use an http(s) URL with {{trace_id}} "
            "where the trace id goes, e.g. https://jaeger.example.com/trace/{trace_id}"
        )


def _check_retention(s: Settings) -> None:
    """Refused at start, not when the retention side task first runs."""
    if not 1 <= s.retention_batch_size <= 10_000:
        raise ConfigurationError(
            f"OUTBOX_RETENTION_BATCH_SIZE={s.retention_batch_size} is out of range; use 1 to 10000"
        )
    if s.retention_interval_s <= 0:
        raise ConfigurationError(
            f"OUTBOX_RETENTION_INTERVAL_S={s.retention_interval_s:g} must be positive, e.g. 3600"
        )
    if not MIN_RETENTION_PACE <= s.retention_pace <= 1:  # (NaN fails it too)
        raise ConfigurationError(
            f"OUTBOX_RETENTION_PACE={s.retention_pace:g} is the share of the time the purge"
            " works: use a number from 0.01 to 1, e.g. 0.25"
        )
    forget_s = s.retention_forget_keys_after_s
    if forget_s and not 0 < s.retention_older_than_s <= forget_s:
        raise ConfigurationError(
            "OUTBOX_RETENTION_FORGET_KEYS_AFTER forgets keys whose effects retention deleted:"
            " set OUTBOX_RETENTION_OLDER_THAN too, to at most the same duration"
            " (e.g. 30d, with 400d for the keys)"
        )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a process needs to know, in one immutable place."""

    # Empty means: start (or reuse) the private PostgreSQL cluster.
    database_url: str = ""
    # Where the private cluster and other local state live: one per user.
    state_dir: Path = dataclasses.field(default_factory=lambda: default_state_dir(os.environ))
    # Dispatcher.
    worker_id: str = ""
    # Measured on a 2-core host (docs/dispatcher.md, "Throughput"): 128 sends in flight
    # and claims of ~250 rows (the worker claims again when half a batch of room is
    # free) delivered 1.08x as many a second as 64 and 200 (bench dispatch --settings),
    # PostgreSQL ~15 % less CPU per delivery (each claim and record has a fixed cost:
    # planning, the commit).
    concurrency: int = 128
    claim_batch_size: int = 500
    # Of those, at most this many at once per endpoint that cannot deduplicate: a
    # crash leaves at most this many of its effects 'uncertain' per worker
    # (dispatch/lanes.py; docs/dispatcher.md, "Uncertain sends").
    nondedup_concurrency: int = 4
    # After a short claim the claim, and every record, runs as a statement prepared
    # once per connection (store.Statements, dispatcher/dispatch/prepared.py); off behind
    # a PgBouncer in transaction pooling mode.
    prepared_statements: bool = True
    # The one LISTEN connection of each dispatcher: a URL straight to PostgreSQL when
    # database_url goes through a PgBouncer in transaction pooling mode (a pooled
    # server connection does not keep a LISTEN); empty: database_url.
    listen_database_url: str = ""
    # The dispatcher's planner and commit settings (store.SESSION_SETTINGS) sent as
    # connection options; off behind PgBouncer, which refuses them: then they are
    # set on the dispatcher's role (ALTER ROLE ... SET), and checked at start.
    startup_options: bool = True
    lease_s: float = 60.0
    poll_interval_s: float = 1.0
    shutdown_timeout_s: float = 30.0
    heartbeat_interval_s: float = 5.0
    # A progress line (delivered, retried, dead, rate, queue depth) this often; 0: off.
    progress_interval_s: float = 30.0
    # Worker processes under one supervisor; 0: one per CPU core of the host.
    processes: int = 0
    retry_schedule_s: tuple[float, ...] = DEFAULT_RETRY_SCHEDULE_S
    retry_after_cap_s: float = 3600.0
    # Retention in the dispatcher (off at 0): purge effects finished longer ago.
    retention_older_than_s: float = 0.0
    retention_interval_s: float = 3600.0
    retention_batch_size: int = 1000
    # The share of wall time the dispatcher's purge works (a rest after each batch):
    # it yields to the drain it runs beside (bench/RESULTS.md, "Retention at a pace").
    retention_pace: float = DEFAULT_RETENTION_PACE
    # The key ledger's horizon (0: keys kept for ever): keys finished longer ago are
    # forgotten, and could be enqueued and sent again.
    retention_forget_keys_after_s: float = 0.0
    # An endpoint failing continuously this long is disabled automatically (0: never).
    auto_disable_after_s: float = DEFAULT_AUTO_DISABLE_AFTER_S
    # The circuit breaker (Breaker): from this many failures in a row an endpoint
    # rests breaker_base_s, doubling with every further failure, at most breaker_max_s.
    breaker_failures: int = Breaker.failures
    breaker_base_s: float = Breaker.base_s
    breaker_max_s: float = Breaker.max_s
    # Destinations in these networks pass the SSRF guard (empty: public only).
    ssrf_allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # Where a dispatcher serves /metrics (with --metrics-port); 0.0.0.0 in a container.
    metrics_host: str = "127.0.0.1"
    # CA bundle trusted for SMTP TLS besides the system's (a private relay's CA).
    smtp_ca_file: str = ""
    # API.
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # Payload fields masked for the support role (dotted paths, e.g. "customer.email").
    sensitive_fields: tuple[str, ...] = ()
    # The support page's cookies lose their Secure flag: only for plain HTTP on a
    # developer's machine (the demo sets it), never behind a real deployment.
    ui_insecure_cookie: bool = False
    # The support page links each attempt's trace id here: a trace viewer's URL with
    # {trace_id} (and optionally {span_id}), e.g. Jaeger's .../trace/{trace_id}.
    trace_url_template: str = ""
    log_format: str = "json"
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if env is None else env
        defaults = cls()
        settings = cls(
            database_url=env.get("DATABASE_URL", ""),
            state_dir=Path(env.get("OUTBOX_STATE_DIR") or default_state_dir(env)),
            worker_id=env.get("OUTBOX_WORKER_ID", ""),
            concurrency=_env_int(env, "OUTBOX_CONCURRENCY", defaults.concurrency),
            claim_batch_size=_env_int(env, "OUTBOX_CLAIM_BATCH_SIZE", defaults.claim_batch_size),
            nondedup_concurrency=_env_int(
                env, "OUTBOX_NONDEDUP_CONCURRENCY", defaults.nondedup_concurrency
            ),
            prepared_statements=_env_flag(env, "OUTBOX_PREPARED_STATEMENTS", default=True),
            listen_database_url=env.get("OUTBOX_LISTEN_DATABASE_URL", ""),
            startup_options=_env_flag(env, "OUTBOX_STARTUP_OPTIONS", default=True),
            lease_s=_env_float(
                env,
                "OUTBOX_LEASE_S",
                # The name before every duration setting ended in _S; still read.
                _env_float(env, "OUTBOX_LEASE_SECONDS", defaults.lease_s),
            ),
            poll_interval_s=_env_float(env, "OUTBOX_POLL_INTERVAL_S", defaults.poll_interval_s),
            shutdown_timeout_s=_env_float(
                env, "OUTBOX_SHUTDOWN_TIMEOUT_S", defaults.shutdown_timeout_s
            ),
            heartbeat_interval_s=_env_float(
                env, "OUTBOX_HEARTBEAT_INTERVAL_S", defaults.heartbeat_interval_s
            ),
            progress_interval_s=_env_float(
                env, "OUTBOX_PROGRESS_INTERVAL_S", defaults.progress_interval_s
            ),
            processes=_env_int(env, "OUTBOX_PROCESSES", defaults.processes),
            retry_schedule_s=_retry_schedule(env, "OUTBOX_RETRY_SCHEDULE_S")
            or defaults.retry_schedule_s,
            retry_after_cap_s=_env_float(
                env, "OUTBOX_RETRY_AFTER_CAP_S", defaults.retry_after_cap_s
            ),
            auto_disable_after_s=_env_float(
                env, "OUTBOX_AUTO_DISABLE_AFTER_S", defaults.auto_disable_after_s
            ),
            breaker_failures=_env_int(env, "OUTBOX_BREAKER_FAILURES", defaults.breaker_failures),
            breaker_base_s=_env_float(env, "OUTBOX_BREAKER_BASE_S", defaults.breaker_base_s),
            breaker_max_s=_env_float(env, "OUTBOX_BREAKER_MAX_S", defaults.breaker_max_s),
            ssrf_allow_networks=_networks(env, "OUTBOX_SSRF_ALLOW_NETWORKS"),
            metrics_host=env.get("OUTBOX_METRICS_HOST", defaults.metrics_host),
            retention_older_than_s=_env_duration(env, "OUTBOX_RETENTION_OLDER_THAN"),
            retention_interval_s=_env_float(
                env, "OUTBOX_RETENTION_INTERVAL_S", defaults.retention_interval_s
            ),
            retention_batch_size=_env_int(
                env, "OUTBOX_RETENTION_BATCH_SIZE", defaults.retention_batch_size
            ),
            retention_pace=_env_float(env, "OUTBOX_RETENTION_PACE", defaults.retention_pace),
            retention_forget_keys_after_s=_env_duration(env, "OUTBOX_RETENTION_FORGET_KEYS_AFTER"),
            smtp_ca_file=env.get("OUTBOX_SMTP_CA_FILE", ""),
            api_host=env.get("OUTBOX_API_HOST", defaults.api_host),
            api_port=_env_int(env, "OUTBOX_API_PORT", defaults.api_port),
            sensitive_fields=_env_list(env, "OUTBOX_SENSITIVE_FIELDS"),
            ui_insecure_cookie=_env_flag(env, "OUTBOX_UI_INSECURE_COOKIE"),
            trace_url_template=env.get("OUTBOX_TRACE_URL_TEMPLATE", ""),
            log_format=env.get("OUTBOX_LOG_FORMAT", defaults.log_format),
            log_level=env.get("OUTBOX_LOG_LEVEL", defaults.log_level),
        )
        settings = dataclasses.replace(settings, **overrides) if overrides else settings
        _check_retention(settings)
        _check_breaker(settings)
        _check_trace_url_template(settings.trace_url_template)
        _check_lanes(settings)
        _check_ranges(settings)
        _check_logging(settings)
        for name, url in (
            ("DATABASE_URL", settings.database_url),
            ("OUTBOX_LISTEN_DATABASE_URL", settings.listen_database_url),
        ):
            if url:
                check_url(url, name)
        return settings

    @property
    def breaker(self) -> Breaker:
        return Breaker(self.breaker_failures, self.breaker_base_s, self.breaker_max_s)

    def __repr__(self) -> str:
        """The fields, the database URL's password masked: a settings object ends up in
        logs, tracebacks and debuggers, where the password must not."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("database_url", "listen_database_url"):
            if shown[name]:
                shown[name] = redact(shown[name])
        fields = ", ".join(f"{name}={value!r}" for name, value in shown.items())
        return f"{type(self).__name__}({fields})"
