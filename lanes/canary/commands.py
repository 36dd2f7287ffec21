"""`lanes canary run|pin|report|release`: exit 0 when nothing drifted, 1 when something did, 2 on
bad usage (a bad config, a path that can not be written)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import trio

import lanes
from lanes._core.check import check_config
from lanes._core.config.schema import Config, packaged
from lanes._core.model.errors import ConfigError
from lanes._core.open import open_store
from lanes.canary import report as fmt
from lanes.canary.prompts import CanaryConfig, read_canary
from lanes.canary.run import pin, release, report, run_canary, select


def progress_printer(out: TextIO | None = None) -> Callable[[int, int], None]:
    """Progress on a terminal (one line, rewritten); elsewhere a plain line at each quarter, so a
    log file or a pipe never fills with carriage returns."""
    stream = out or sys.stderr
    tty = stream.isatty()

    def progress(done: int, total: int) -> None:
        if tty:
            end = "" if done < total else "\n"
            print(f"\rcanary: {done}/{total} probes", end=end, file=stream, flush=True)
        elif done == total or done % max(1, total // 4) == 0:
            print(f"canary: {done}/{total} probes", file=stream, flush=True)

    return progress


def _unusable(args: argparse.Namespace, config: Config, models: list[str]) -> str | None:
    """Why the command can not run as asked (exit 2), or None."""
    if (config.local_state if config.shared_state else config.state) == ":memory:":
        return (
            "the canary keeps its answers in the state file; "
            "set `state` (or `local_state` with a Redis `state`) in the config"
        )
    if args.md and not os.access(Path(args.md).resolve().parent, os.W_OK):
        return f"can not write {args.md}: its folder is missing or read-only"
    if args.action == "release" and not models:
        return "release needs the models to release, e.g. lane/model"
    return None


async def _run(config: Config, prompts: CanaryConfig, lanes_: list[str], models: list[str]) -> bool:
    """`lanes canary run`: say each lane or model asked for that is not probed, and why; probe the
    rest. False (and one line saying why) when there was nothing to probe."""
    async with lanes.open_dispatcher(config) as dispatcher:
        chosen, skipped = select(dispatcher, lanes_, models)
        for what, why in skipped.items():
            print(f"lanes canary: skipped {what}: {why}", file=sys.stderr)
        if not chosen:
            asked = ", ".join([*lanes_, *models])
            said = f"of {asked}" if asked else "(no local or free chat model is loaded)"
            print(f"lanes canary: probed nothing {said}: nothing was checked", file=sys.stderr)
            return False
        await run_canary(
            dispatcher, prompts, lanes_=lanes_, models=models, progress=progress_printer()
        )
    return True


def main(args: argparse.Namespace) -> int:
    try:
        config = check_config(args.config or packaged("lanes.toml"))
        prompts = read_canary(args.canary or packaged("canary.toml"))
    except ConfigError as exc:
        print(f"lanes canary: {exc}", file=sys.stderr)
        return 2
    models = [*args.keys, *args.model]
    if (unusable := _unusable(args, config, models)) is not None:
        print(f"lanes canary: {unusable}", file=sys.stderr)
        return 2
    if args.action == "run" and not trio.run(_run, config, prompts, args.lane, models):
        return 1
    store = open_store(config)
    try:
        if args.action == "release":
            for key, was in release(store, models).items():
                print(f"{key}: released" if was else f"{key}: was not quarantined")
            return 0
        if args.action == "pin":
            pinned = pin(store, keys=models)
            print(
                f"pinned {len(pinned)} model(s): "
                f"{', '.join(pinned) or 'none (run the canary first)'}"
                + (f"; released {', '.join(models)}" if models else "")
            )
            return 0
        reports = report(store, prompts)
    finally:
        store.close()
    if args.md:
        Path(args.md).write_text(fmt.markdown(reports), encoding="utf-8")
    print(fmt.as_json(reports) if args.json else fmt.table(reports))
    return fmt.exit_code(reports)
