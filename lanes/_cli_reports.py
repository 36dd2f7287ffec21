"""`lanes report` and `lanes explain`: the audit's measures per cohort (or class, lane, model,
client), and the story of one request — read from the state file, or from a running sidecar. Also
what every command asking a sidecar shares: `call`, `error_message`, and the two failures a user
can cause (`UsageError`, `SidecarRefused`), which `lanes._cli` says in one line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx2

from lanes._cli_inputs import audit_source
from lanes._core.audit.report import GROUPS, Report, explain, parse_since, report
from lanes._core.config.schema import read_config
from lanes._core.model.errors import ConfigError
from lanes._core.state.store import SQLiteStore


class UsageError(Exception):
    """A mistake in how the command was called: one line on stderr, exit 2."""


class SidecarRefused(Exception):
    """The sidecar answered other than 200: its message on stderr, exit `code`."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def error_message(body: Any) -> str:
    """What a sidecar's error answer says: OpenAI's `error.message`, else the body itself."""
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message", body)) if isinstance(error, dict) else str(body)


def add_parsers(sub: Any, default_url: str) -> None:
    rep = sub.add_parser(
        "report", help="free share, retries, paid cost, latency, errors per cohort"
    )
    rep.add_argument("--since", default="1d", help="1d, 7d, 12h, or a UTC date such as 2026-11-01")
    rep.add_argument("--by", default="cohort", choices=GROUPS)
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--md", default=None, help="also write the report as Markdown to this file")
    exp = sub.add_parser("explain", help="the story of one request (its X-Lanes-Request-Id)")
    exp.add_argument("request_id")
    exp.add_argument("--json", action="store_true")
    for p in (rep, exp):
        p.add_argument(
            "--config",
            default=None,
            help="read its state file (default: a sidecar answering at the shipped config's "
            "address, else that config's state file)",
        )
        p.add_argument(
            "--url", default=None, help=f"ask the running sidecar at URL (e.g. {default_url})"
        )


def _store(path: str) -> tuple[SQLiteStore, float]:
    """The config's local SQLite file (the audit lives there), and the paid ceiling."""
    config = read_config(path)
    state = config.local_state if config.shared_state else config.state
    if state == ":memory:" or not Path(state).expanduser().exists():
        raise ConfigError(f"{path}: its state ({state}) is not a file with an audit to read")
    return SQLiteStore(state), config.policy.paid_ceiling_usd_per_day


def call(method: str, url: str, body: Any = None, *, timeout_s: float = 10.0) -> tuple[int, Any]:
    """One request to a running sidecar: JSON for every action, and the key in `LANES_KEY`, if set
    (with client keys configured, reading needs a client key and acting needs an admin key)."""
    headers = {"content-type": "application/json"}
    if key := os.environ.get("LANES_KEY", "").strip():
        headers["authorization"] = f"Bearer {key}"
    with httpx2.Client(timeout=timeout_s, trust_env=False) as client:
        content = None if method == "GET" else json.dumps(body or {}).encode()
        response = client.request(method, url, content=content, headers=headers)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def run_report(args: argparse.Namespace) -> int:
    try:
        kind, where = audit_source(args)
        if kind == "url":
            code, body = call(
                "GET", f"{where}/v1/report?since={args.since}&by={args.by}", timeout_s=30.0
            )
            if code != 200:
                print(f"lanes: {error_message(body)}", file=sys.stderr)
                return 1
        else:
            store, ceiling = _store(where)
            since = parse_since(args.since, time.time())  # wall-clock: "since" is a date
            body = report(
                store.records.query, since=since, by=args.by, ceiling_usd=ceiling
            ).as_dict()
            store.close()
    except (ConfigError, ValueError) as exc:
        print(f"lanes: {exc}", file=sys.stderr)
        return 2
    if args.md:
        Path(args.md).write_text(markdown(body), encoding="utf-8")
    print(
        json.dumps(body, indent=2) if args.json else markdown(body),
        end="" if not args.json else "\n",
    )
    return 0


def run_explain(args: argparse.Namespace) -> int:
    try:
        kind, where = audit_source(args)
        if kind == "url":
            code, story = call("GET", f"{where}/v1/requests/{args.request_id}", timeout_s=30.0)
            story = story if code == 200 else None
        else:
            store, _ = _store(where)
            story = explain(store.records.query, args.request_id)
            store.close()
    except ConfigError as exc:
        print(f"lanes: {exc}", file=sys.stderr)
        return 2
    if story is None:
        print(f"lanes: no request {args.request_id!r} in the audit", file=sys.stderr)
        return 1
    print(json.dumps(story, indent=2) if args.json else story_text(story))
    return 0


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(body: dict[str, Any]) -> str:
    """The report as Markdown tables (also the human output of `lanes report`)."""
    head = (
        "| {by} | jobs | answered | abandoned | free share | free primary ok | free retry | "
        "paid jobs | paid cost | attempts/answer | requests |"
    ).format(by=body["by"])
    lines = [
        f"# lanes report since {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(body['since']))}",
        "",
        head,
        "|" + "---|" * 11,
    ]
    for g in [*body["groups"], body["total"]]:
        lines.append(
            f"| {g['key'] or '—'} | {g['jobs']} | {g['answered']} | {g['abandoned']} | "
            f"{_pct(g['free_share'])} | "
            f"{_pct(g['primary_free_success'])} | {_pct(g['free_retry_rate'])} | "
            f"{g['paid_jobs']} | ${g['paid_cost_usd']:.6f} | "
            f"{_ratio(g['attempts_per_answer'])} | {g['requests']} |"
        )
    total = body["total"]
    lines += [
        "",
        "Free-retry reasons: " + (json.dumps(total["free_retry_reasons"]) or "{}"),
        "Latency per route state (mean s): "
        + json.dumps({k: round(v, 4) for k, v in total["latency_s_by_route"].items()}),
        "Errors by category: " + json.dumps(total["errors"]),
        "Privacy (need → endpoint used): " + json.dumps(total["privacy"]),
        f"Response cache: {total.get('cache_hits', 0)} hits, saved "
        f"{total.get('cache_saved_tokens', 0)} tokens and ${total.get('cache_saved_usd', 0.0):.6f}",
        "",
        "| day | jobs | answered | free share | paid share | attempts/answer | paid spend "
        "| ceiling |",
        "|" + "---|" * 8,
    ]
    lines += [f"| {d['day']} | {_over_time(d)} ${d['ceiling_usd']:.2f} |" for d in body["days"]]
    lines += [
        "",
        "| hour (UTC) | jobs | answered | free share | paid share | attempts/answer | paid spend |",
        "|" + "---|" * 7,
    ]
    lines += [
        f"| {time.strftime('%Y-%m-%d %H:00', time.gmtime(h['hour']))} | {_over_time(h)}"
        for h in body["hours"]
    ]
    return "\n".join(lines) + "\n"


def _over_time(row: dict[str, Any]) -> str:
    """The cells a day and an hour have in common, each followed by its ` |`."""
    return (
        f"{row['jobs']} | {row['answered']} | {_pct(row['free_share'])} | "
        f"{_pct(row['paid_share'])} | {_ratio(row['attempts_per_answer'])} | "
        f"${row['paid_cost_usd']:.6f} |"
    )


def story_text(story: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(story["at"]))
    lines = [
        f"request {story['job']} at {when}: {story['summary']}",
        f"client {story['client']}, cohort {story['cohort'] or '—'}, class {story['class']}, "
        f"privacy {story['privacy'] or 'any'}; request {story['request_bytes']} bytes "
        f"(sha256 {story['request_sha256'][:16]}…)",
        "plan: " + (", ".join(story["plan"]) or "—"),
    ]
    if story.get("dropped"):
        lines.append("dropped (not sent): " + ", ".join(story["dropped"]))
    lines += [f"  skipped {s['lane']}/{s['model']}: {s['reason']}" for s in story["skips"]]
    for a in story["attempt_list"]:
        lines.append(
            f"  attempt {a['n'] + 1}: {a['route']} {a['lane']}/{a['model']} → {a['outcome']}"
            f"{' (' + a['category'] + ')' if a['category'] else ''}, "
            f"{a['latency_s'] * 1000:.0f} ms, "
            f"{a['tokens']} tokens, ${a['cost_usd']:.6f}{' [retry]' if a['retry'] else ''}"
        )
    if story["paid_before_usd"] is not None:
        lines.append(
            f"paid today: ${story['paid_before_usd']:.6f} before, "
            f"${story['paid_after_usd']:.6f} after"
        )
    return "\n".join(lines)


__all__ = [
    "Report",
    "SidecarRefused",
    "UsageError",
    "add_parsers",
    "call",
    "error_message",
    "markdown",
    "run_explain",
    "run_report",
    "story_text",
]
