"""`lanes whatif`: the audit's jobs of a window replayed under a new config (and the current one),
side by side with what was recorded and the oracle's bound; exits 1 when a `--fail-if-…` gate
fails, so a config change can be checked in CI. How to read it: docs/whatif.md."""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from lanes._cli_inputs import NotFound, sidecar_state, sidecar_url, state_of
from lanes._core.audit.report import parse_since
from lanes._core.config.schema import packaged
from lanes._core.model.errors import ConfigError
from lanes._whatif import WhatIf, whatif
from lanes._whatif.figures import as_json, markdown, table, text


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "whatif", help="replay the audit under another config: free share, spend, failures"
    )
    p.add_argument(
        "--config",
        default=None,
        help="the config to try (TOML; default: the current one — --against, else the shipped "
        "config — replayed against its own audit: the fidelity check alone)",
    )
    p.add_argument(
        "--against",
        default=None,
        help="the current config (TOML), replayed the same way for a like-for-like difference",
    )
    p.add_argument(
        "--audit",
        default=None,
        help="the SQLite file holding the audit (default: the state file of --against, "
        "else of the shipped config)",
    )
    p.add_argument(
        "--since", default="7d", help="7d, 12h, a UTC date such as 2026-11-24, or epoch s"
    )
    p.add_argument("--until", default=None, type=float, help="epoch seconds (default: now)")
    p.add_argument("--faults", action="store_true", help="answer the recorded failures again")
    p.add_argument("--json", action="store_true")
    p.add_argument("--md", default=None, help="also write the comparison as Markdown to this file")
    p.add_argument("--fail-if-free-share-below", type=float, default=None, metavar="X")
    p.add_argument("--fail-if-spend-above", type=float, default=None, metavar="USD")


def _audit_path(args: argparse.Namespace) -> str:
    """--audit, else the state file of --against, else of the shipped config, else of the sidecar
    answering at the shipped config's address."""
    if args.audit:
        return str(args.audit)
    source = args.against or str(packaged("lanes.toml"))
    whose = args.against or "the shipped config"
    state = state_of(source)
    if state != ":memory:" and Path(state).expanduser().is_file():
        return state
    if not args.against and (running := sidecar_state(url := sidecar_url(args))) is not None:
        if running == ":memory:":
            raise NotFound(
                f"the sidecar at {url} keeps its state in memory: no audit to replay; start it "
                "with --state FILE (or `state` in its config), or pass --audit FILE"
            )
        return running
    raise NotFound(
        f"no audit at {state} (the state of {whose}); pass --audit FILE, or --against the "
        "config the sidecar ran with"
    )


def _configs(args: argparse.Namespace) -> tuple[str, str | None, bool]:
    """The config to try, the current one, and whether the one to try is the current one (its
    replay is then the fidelity check): without --config, the current config is tried."""
    if args.config:
        return args.config, args.against, False
    return args.against or str(packaged("lanes.toml")), None, True


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(1, total)
    end = "\n" if done >= total else ""
    sys.stderr.write(f"\rreplaying {'#' * filled}{'.' * (width - filled)} {done:,}/{total:,}{end}")
    sys.stderr.flush()


def _check_gates(args: argparse.Namespace) -> None:
    share, spend = args.fail_if_free_share_below, args.fail_if_spend_above
    if share is not None and not 0.0 <= share <= 1.0:  # nan fails this too
        raise ConfigError(
            f"--fail-if-free-share-below: {share!r} is not a share from 0 to 1 (0.8 for 80 %)"
        )
    if spend is not None and not (math.isfinite(spend) and spend >= 0):
        raise ConfigError(f"--fail-if-spend-above: {spend!r} is not a sum of dollars")


def run(args: argparse.Namespace) -> int:
    _check_gates(args)
    audit = _audit_path(args)
    if not Path(audit).expanduser().is_file():
        raise ConfigError(f"{audit}: no audit here (no such file); pass --audit FILE")
    config, against, served = _configs(args)
    now = args.until if args.until is not None else time.time()  # wall-clock: "now"
    since: float
    try:
        since = float(args.since)
    except ValueError:  # not epoch seconds: "7d", "12h", a date
        try:
            since = parse_since(args.since, now)
        except ValueError as exc:
            raise ConfigError(f"--since: {exc}", key="since") from None
    for name, value in (("since", since), ("until", now)):
        if not 0 <= value < 1e11:  # nan, inf, before 1970, past the year 5000
            raise ConfigError(f"--{name} must be epoch seconds or a date (got {value})", key=name)
    try:
        result = whatif(
            config,
            audit,
            since=since,
            until=now,
            against=against,
            faults=args.faults,
            served=served,
            progress=_progress if sys.stderr.isatty() and not args.json else None,
        )
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"{audit}: not an audit lanes can read ({exc})") from None
    _show(args, result)
    return _gates(args, result)


def _show(args: argparse.Namespace, result: WhatIf) -> None:
    rows = table(result.columns)
    if args.md:
        Path(args.md).write_text(markdown(rows) + "\n\n" + _notes_md(result), encoding="utf-8")
    if args.json:
        print(as_json(result))
    else:
        print(_heading(result))
        print(text(rows))
        for note in result.notes:
            print(f"- {note}")
        for warning in result.warnings:
            print(f"warning: {warning}")


def _heading(result: WhatIf) -> str:
    def at(epoch: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))

    return (
        f"lanes whatif: {result.jobs:,} jobs from {at(result.since)} to {at(result.until)} UTC, "
        f"replayed in {result.wall_s:.1f} s\n"
    )


def _notes_md(result: WhatIf) -> str:
    lines = [f"- {n}" for n in result.notes] + [f"- **warning**: {w}" for w in result.warnings]
    return _heading(result) + "\n" + "\n".join(lines) + "\n"


def _gates(args: argparse.Namespace, result: WhatIf) -> int:
    failed = []
    gated = args.fail_if_free_share_below is not None or args.fail_if_spend_above is not None
    if gated and result.jobs == 0:
        print("lanes whatif: no jobs in the window: nothing to check", file=sys.stderr)
        return 1
    share = result.new.free_share or 0.0
    if args.fail_if_free_share_below is not None and share < args.fail_if_free_share_below:
        failed.append(
            f"free share {100 * share:.1f} % is below {100 * args.fail_if_free_share_below:.1f} %"
        )
    worst = max((d.spent_usd for d in result.new.days), default=0.0)
    if args.fail_if_spend_above is not None and worst > args.fail_if_spend_above:
        failed.append(f"a day's paid spend ${worst:.4f} is above ${args.fail_if_spend_above:.4f}")
    for line in failed:
        print(f"lanes whatif: {line} ({result.new.label})", file=sys.stderr)
    return 1 if failed else 0
