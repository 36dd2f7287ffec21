"""The real clients' suite (`make test-clients`, `pytest tests/clients --clients`): coding agents
and SDKs nobody here wrote, run unmodified against `lanes serve --simulate`. This module is what
its tests share: where the npm clients are, a clean environment for a client process, the JSON
lines it printed.

The npm clients (`codex`, `claude`, the `ai` SDK) are installed by the make target into `.clients/`
at the repository's top, from `tests/clients/package.json` and its lock; where npm could not
install them their tests skip and say why. The Python SDKs come from the `clients` extra.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx2
import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_BIN = ROOT / ".clients" / "node_modules" / ".bin"


def npm_client(name: str) -> Path:
    """The path of an npm-installed client, or skip saying why it is missing."""
    path = NODE_BIN / name
    if not path.exists():
        why = (
            (ROOT / ".clients" / "npm-failed").read_text().strip()
            if (ROOT / ".clients" / "npm-failed").exists()
            else "not installed"
        )
        pytest.skip(f"{name}: {why} (make test-clients installs it from the npm registry)")
    if shutil.which("node") is None:
        pytest.skip(f"{name}: node is not on PATH")
    return path


def recent_jobs(base: str) -> list[dict[str, Any]]:
    """The sidecar's recent jobs (newest first), as `/v1/lanes` shows them."""
    state = httpx2.get(f"{base.removesuffix('/v1')}/v1/lanes", timeout=5).json()
    return list(state.get("recent") or state.get("recent_jobs") or [])


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment for a client process: its own HOME, no proxy, no real keys."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR")}
    return {**keep, "HOME": str(home), "NO_COLOR": "1", **extra}


def events(stdout: str) -> list[dict[str, Any]]:
    """The JSON lines a client printed (its `--json` / `stream-json` events), others ignored."""
    out: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
