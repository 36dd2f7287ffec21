"""What every drill is and returns, and the table `lanes drill` runs them from."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs

from lanes.harness.redis_server import redis_server_path


@attrs.frozen(kw_only=True)
class Result:
    name: str
    ok: bool
    figure: str
    detail: str = ""


Drill = Callable[[Path], Awaitable[Result]]
DRILLS: dict[str, Drill] = {}


def summary(fn: Drill) -> str:
    """A drill's summary in `lanes drill --list` and `drills/README.md`: its docstring's first
    paragraph, on one line."""
    first = (fn.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def table() -> str:
    """Every drill and what it proves, as the Markdown table `lanes drill --list --md` prints."""
    rows = [f"| `{name}` | {summary(fn)} |" for name, fn in DRILLS.items()]
    return "\n".join(["| drill | what it proves |", "|---|---|", *rows]) + "\n"


def drill(name: str) -> Callable[[Drill], Drill]:
    def register(fn: Drill) -> Drill:
        DRILLS[name] = fn
        return fn

    return register


def check(name: str, figure: str, **conditions: bool) -> Result:
    failed = [k for k, v in conditions.items() if not v]
    return Result(
        name=name,
        ok=not failed,
        figure=figure,
        detail=("failed: " + ", ".join(failed)) if failed else "",
    )


def without_redis(name: str) -> Result | None:
    """The result of drill `name`, which needs redis-server, where there is none: skipped — or
    failed where LANES_REQUIRE_REDIS=1 (as in CI) says it must run. None: redis-server is here."""
    if redis_server_path() is not None:
        return None
    required = os.environ.get("LANES_REQUIRE_REDIS") == "1"
    return Result(
        name=name, ok=not required, figure="skipped: redis-server is not installed (make redis)"
    )
