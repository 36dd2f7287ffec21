"""Judge-free checks on one answer. Pure."""

from __future__ import annotations

# lanes: pure
import json
import re
from collections.abc import Mapping
from typing import Any

from lanes.canary.prompts import Checks

_REFUSAL = re.compile(
    r"\b(i can(?:'|no)t|i cannot|i'm unable|i am unable|as an ai\b|i won't)", re.IGNORECASE
)


def normalise(text: str) -> str:
    """Lower case, single spaces, no surrounding quotes or trailing full stop."""
    text = " ".join(text.strip().lower().split())
    return text.strip("\"'`").rstrip(".").strip()


def run_checks(
    checks: Checks, text: str, tool_calls: list[Mapping[str, Any]] | None = None
) -> dict[str, bool]:
    """Each configured check's result for an answer."""
    out: dict[str, bool] = {}
    norm = normalise(text)
    if checks.expect is not None:
        out["expect"] = norm == normalise(checks.expect)
    for needle in checks.contains:
        out[f"contains:{needle}"] = normalise(needle) in norm
    if checks.json_keys:
        try:
            parsed = json.loads(
                text.strip().removeprefix("```json").removeprefix("```").removesuffix("```")
            )
            out["json"] = isinstance(parsed, dict) and all(k in parsed for k in checks.json_keys)
        except ValueError:
            out["json"] = False
    if checks.tool_call is not None:
        out["tool_call"] = any(_well_formed(call, checks.tool_call) for call in tool_calls or [])
    if checks.no_refusal:
        out["no_refusal"] = not _REFUSAL.search(text)
    out["length"] = checks.min_len <= len(text) <= checks.max_len
    return out


def _well_formed(call: Mapping[str, Any], name: str) -> bool:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or function.get("name") != name:
        return False
    try:
        return isinstance(json.loads(function.get("arguments") or ""), dict)
    except ValueError:
        return False
