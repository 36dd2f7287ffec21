"""What every drill is and returns, and the table `lanes drill` runs them from."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs


@attrs.frozen(kw_only=True)
class Result:
    name: str
    ok: bool
    figure: str
    detail: str = ""


Drill = Callable[[Path], Awaitable[Result]]
DRILLS: dict[str, Drill] = {}


# The first line of a drill's docstring is its summary in `lanes drill --list`: a long one is
# continued with a backslash-newline (which Python drops), so that it stays one line at runtime.
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
