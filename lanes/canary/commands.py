"""`lanes canary run|pin|report`: exit 0 when nothing drifted, 1 when something did, 2 on bad
usage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

import lanes
from lanes._core.errors import ConfigError
from lanes._core.open import open_store
from lanes.canary import report as fmt
from lanes.canary.prompts import read_canary
from lanes.canary.run import pin, report, run_canary


def main(args: argparse.Namespace) -> int:
    try:
        config = lanes.read_config(args.config)
        prompts = read_canary(args.canary)
    except ConfigError as exc:
        print(f"lanes canary: {exc}", file=sys.stderr)
        return 2
    if (config.local_state if config.shared_state else config.state) == ":memory:":
        print(
            "lanes canary: the canary keeps its answers in the state file; "
            "set `state` (or `local_state` with a Redis `state`) in the config",
            file=sys.stderr,
        )
        return 2
    if args.action == "run":

        def progress(done: int, total: int) -> None:
            print(
                f"\rcanary: {done}/{total} probes",
                end="" if done < total else "\n",
                file=sys.stderr,
                flush=True,
            )

        async def go() -> None:
            async with lanes.open_dispatcher(config) as dispatcher:
                await run_canary(
                    dispatcher, prompts, lanes_=args.lane, models=args.model, progress=progress
                )

        trio.run(go)
    store = open_store(config)
    try:
        if args.action == "pin":
            pinned = pin(store, keys=args.model)
            print(
                f"pinned {len(pinned)} model(s): "
                f"{', '.join(pinned) or 'none (run the canary first)'}"
            )
            return 0
        reports = report(store, prompts)
    finally:
        store.close()
    print(fmt.as_json(reports) if args.json else fmt.table(reports))
    if args.md:
        Path(args.md).write_text(fmt.markdown(reports), encoding="utf-8")
    return fmt.exit_code(reports)
