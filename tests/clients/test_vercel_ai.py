"""The Vercel AI SDK (`ai`, `@ai-sdk/openai`, `@ai-sdk/anthropic`), unmodified, against
`lanes serve --simulate`: generateText and streamText finish a tool loop over the Responses API,
chat completions and the Messages API."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lanes.testing import ANSWER
from realclients import NODE_BIN, clean_env, events

SCRIPT = Path(__file__).with_name("vercel_ai.mjs")


def test_vercel_ai_sdk_tool_loops(simulated, tmp_path):
    """Every wire API, generated and streamed: the tool is called once, the answer follows."""
    modules = NODE_BIN.parent
    if not (modules / "ai").exists() or shutil.which("node") is None:
        pytest.skip("the ai SDK is not installed (make test-clients installs it from npm)")
    script = modules.parent / SCRIPT.name  # beside node_modules, so its imports resolve
    script.write_text(SCRIPT.read_text())
    done = subprocess.run(
        ["node", str(script), simulated.removesuffix("/v1")],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = events(done.stdout)
    assert {(r["wire"], r["mode"]) for r in results} == {
        (wire, mode)
        for wire in ("responses", "chat", "messages")
        for mode in ("generate", "stream")
    }
    for result in results:
        assert result["ok"], result
        assert result["calls"] and result["text"] == ANSWER, result
