"""The audit's tables in the SQLite file: one row per job (`audit`), one per upstream request
(`audit_attempt`), and two hourly roll-ups kept in step with them in the same transaction
(`audit_jobs_hourly`, `audit_attempts_hourly`), so that `lanes report` reads a few thousand rows
however many jobs the audit holds. Documented in docs/audit.md.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from lanes._core.state.audit import ATTEMPT_COLUMNS, DIMENSIONS, client_dim

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    job TEXT PRIMARY KEY, at FLOAT, client TEXT, cohort TEXT, class TEXT, route TEXT,
    outcome TEXT, lane TEXT, model TEXT, request_sha256 TEXT, request_bytes INTEGER,
    answer_sha256 TEXT, answer_bytes INTEGER, attempts INTEGER, attempt_log TEXT, skip_log TEXT,
    latency_s FLOAT, tokens INTEGER, cost_usd FLOAT, approval TEXT, explored INTEGER, body TEXT,
    tier TEXT, privacy TEXT, zdr INTEGER, free_attempts INTEGER, first_free_outcome TEXT,
    plan TEXT, paid_before_usd FLOAT, paid_after_usd FLOAT, dropped TEXT, asked TEXT,
    embedding INTEGER, streamed INTEGER, max_tokens INTEGER, deadline_s FLOAT,
    prompt_tokens INTEGER, completion_tokens INTEGER, work TEXT, saved_usd FLOAT);
CREATE INDEX IF NOT EXISTS idx_audit_at ON audit (at);
CREATE TABLE IF NOT EXISTS audit_attempt (
    job TEXT, n INTEGER, at FLOAT, client TEXT, cohort TEXT, class TEXT, lane TEXT, model TEXT,
    tier TEXT, route TEXT, outcome TEXT, category TEXT, status INTEGER, retry INTEGER,
    latency_s FLOAT, tokens INTEGER, cost_usd FLOAT, work TEXT, PRIMARY KEY (job, n));
CREATE INDEX IF NOT EXISTS idx_audit_attempt_at ON audit_attempt (at);
CREATE TABLE IF NOT EXISTS audit_jobs_hourly (
    hour INTEGER, dim TEXT, value TEXT, route TEXT, tier TEXT, outcome TEXT, privacy TEXT,
    zdr INTEGER, first_free_outcome TEXT, retried INTEGER,
    jobs INTEGER, attempts INTEGER, cost_usd FLOAT, saved_tokens INTEGER, saved_usd FLOAT,
    PRIMARY KEY (dim, hour, value, route, tier, outcome, privacy, zdr, first_free_outcome,
                 retried));
CREATE TABLE IF NOT EXISTS audit_attempts_hourly (
    hour INTEGER, dim TEXT, value TEXT, route TEXT, outcome TEXT, category TEXT,
    attempts INTEGER, latency_s FLOAT,
    PRIMARY KEY (dim, hour, value, route, outcome, category));
"""

#: Columns added to `audit` since its first release: a file made by an older version gains them.
ADDED = (
    ("tier", "TEXT"),
    ("privacy", "TEXT"),
    ("zdr", "INTEGER"),
    ("free_attempts", "INTEGER"),
    ("first_free_outcome", "TEXT"),
    ("plan", "TEXT"),
    ("paid_before_usd", "FLOAT"),
    ("paid_after_usd", "FLOAT"),
    ("dropped", "TEXT"),
    ("asked", "TEXT"),
    ("embedding", "INTEGER"),
    ("streamed", "INTEGER"),
    ("max_tokens", "INTEGER"),
    ("deadline_s", "FLOAT"),
    ("prompt_tokens", "INTEGER"),
    ("completion_tokens", "INTEGER"),
    ("work", "TEXT"),
    ("saved_usd", "FLOAT"),  # a cache hit's: what its answer cost when it was made
)
#: Columns added to `audit_jobs_hourly` since its first release.
HOURLY_ADDED = (("saved_tokens", "INTEGER"), ("saved_usd", "FLOAT"))
#: Columns added to `audit_attempt` since its first release.
ATTEMPT_ADDED = (("work", "TEXT"),)
AUDIT_COLUMNS = (
    "job",
    "at",
    "client",
    "cohort",
    "class",
    "route",
    "outcome",
    "lane",
    "model",
    "request_sha256",
    "request_bytes",
    "answer_sha256",
    "answer_bytes",
    "attempts",
    "attempt_log",
    "skip_log",
    "latency_s",
    "tokens",
    "cost_usd",
    "approval",
    "explored",
    "body",
    *(name for name, _ in ADDED),
)
JOB_KEYS = ("route", "tier", "outcome", "privacy", "zdr", "first_free_outcome", "retried")
ATTEMPT_KEYS = ("route", "outcome", "category")


def _dimensions(values: tuple[str, ...]) -> list[tuple[str, str]]:
    """The roll-ups' (dimension, value) pairs of a row whose `DIMENSIONS` hold `values`."""
    every = [("all", "all"), *zip(DIMENSIONS, values, strict=True)]
    client = values[DIMENSIONS.index("client")]
    return every + [(client_dim(dim, client), value) for dim, value in every]


def _values(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(row.get(dim) or "") for dim in DIMENSIONS)


def _key(row: Mapping[str, Any], names: Iterable[str]) -> tuple[Any, ...]:
    return tuple(row.get(name) or (0 if name in ("zdr", "retried") else "") for name in names)


def write(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    """Insert audit rows (each with its `attempt_rows`) and fold them into the hourly roll-ups,
    in one transaction. Rows alike in hour, dimensions and facts (most of a batch) are summed once
    before they are spread over the dimensions."""
    jobs = [{k: v for k, v in row.items() if k != "attempt_rows"} for row in rows]
    attempts = [a for row in rows for a in row.get("attempt_rows", ())]
    alike: dict[tuple[Any, ...], list[Any]] = {}  # (hour, values, facts) → [jobs, attempts, cost]
    for row in jobs:
        facts = _key({**row, "retried": int((row.get("free_attempts") or 0) >= 2)}, JOB_KEYS)
        sums = alike.setdefault((int(row["at"] // 3600), _values(row), facts), [0, 0, 0.0, 0, 0.0])
        cached = row.get("route") == "cache"
        sums[0] += 1
        sums[1] += int(row.get("attempts") or 0)
        sums[2] += float(row.get("cost_usd") or 0.0)
        sums[3] += int(row.get("tokens") or 0) if cached else 0
        sums[4] += float(row.get("saved_usd") or 0.0)
    job_sums: dict[tuple[Any, ...], list[Any]] = {}
    for (hour, values, facts), totals in alike.items():
        for dim, value in _dimensions(values):
            sums = job_sums.setdefault((hour, dim, value, *facts), [0, 0, 0.0, 0, 0.0])
            for i, total in enumerate(totals):
                sums[i] += total
    alike = {}  # (hour, values, facts) → [attempts, latency]
    for a in attempts:
        sums = alike.setdefault((int(a["at"] // 3600), _values(a), _key(a, ATTEMPT_KEYS)), [0, 0.0])
        sums[0] += 1
        sums[1] += float(a.get("latency_s") or 0.0)
    attempt_sums: dict[tuple[Any, ...], list[Any]] = {}
    for (hour, values, facts), (n, latency) in alike.items():
        for dim, value in _dimensions(values):
            sums = attempt_sums.setdefault((hour, dim, value, *facts), [0, 0.0])
            sums[0] += n
            sums[1] += latency
    conn.execute("BEGIN IMMEDIATE")
    try:
        _insert(conn, "audit", AUDIT_COLUMNS, jobs)
        _insert(conn, "audit_attempt", ATTEMPT_COLUMNS, attempts)
        conn.executemany(
            f"INSERT INTO audit_jobs_hourly (hour, dim, value, {', '.join(JOB_KEYS)}, jobs, "
            "attempts, cost_usd, saved_tokens, saved_usd) "
            f"VALUES ({', '.join('?' * (len(JOB_KEYS) + 8))}) ON CONFLICT DO UPDATE SET "
            "jobs = jobs + excluded.jobs, attempts = attempts + excluded.attempts, "
            "cost_usd = cost_usd + excluded.cost_usd, "
            "saved_tokens = COALESCE(saved_tokens, 0) + excluded.saved_tokens, "
            "saved_usd = COALESCE(saved_usd, 0) + excluded.saved_usd",
            [(*key, *sums) for key, sums in job_sums.items()],
        )
        conn.executemany(
            f"INSERT INTO audit_attempts_hourly (hour, dim, value, {', '.join(ATTEMPT_KEYS)}, "
            "attempts, latency_s) "
            f"VALUES ({', '.join('?' * (len(ATTEMPT_KEYS) + 5))}) ON CONFLICT DO UPDATE SET "
            "attempts = attempts + excluded.attempts, latency_s = latency_s + excluded.latency_s",
            [(*key, *sums) for key, sums in attempt_sums.items()],
        )
        conn.execute("COMMIT")
    finally:  # whatever happened, the transaction does not outlive the call
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _insert(
    conn: sqlite3.Connection, table: str, columns: tuple[str, ...], rows: list[dict[str, Any]]
) -> None:
    if rows:
        conn.executemany(
            f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' * len(columns))})",
            [tuple(row.get(c) for c in columns) for row in rows],
        )


def prune(conn: sqlite3.Connection, before: float) -> int:
    """Delete what the audit holds of jobs older than `before` (epoch seconds; the roll-ups by whole
    hours); how many jobs went."""
    with conn:
        conn.execute("DELETE FROM audit_attempt WHERE at < ?", (before,))
        conn.execute("DELETE FROM audit_jobs_hourly WHERE hour < ?", (int(before // 3600),))
        conn.execute("DELETE FROM audit_attempts_hourly WHERE hour < ?", (int(before // 3600),))
        return conn.execute("DELETE FROM audit WHERE at < ?", (before,)).rowcount
