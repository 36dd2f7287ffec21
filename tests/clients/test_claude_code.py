"""Anthropic's Claude Code (`claude -p`, the Messages API), unmodified, against
`lanes serve --simulate`: with its default model and with Sonnet and Haiku — output_config,
context_management, thinking, a system entry inside `messages`, next month's model names — a tool
call round trip finishes with exit 0."""

from __future__ import annotations

import subprocess

import pytest

from realclients import clean_env, events, npm_client


def run_claude(base: str, tmp_path, model: str | None) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    command = [str(npm_client("claude")), "-p", "--output-format", "stream-json", "--verbose"]
    if model:
        command += ["--model", model]
    env = clean_env(
        tmp_path,
        ANTHROPIC_BASE_URL=base.removesuffix("/v1"),
        ANTHROPIC_API_KEY="unused",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return subprocess.run(
        [*command, "list the files here"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("model", [None, "sonnet", "haiku"], ids=["default", "sonnet", "haiku"])
def test_claude_print_finishes_a_tool_round_trip(simulated, tmp_path, model):
    """claude -p: the model's tool_use is answered by a tool_result, the next turn ends the
    conversation, and claude exits 0 with a successful result."""
    done = run_claude(simulated, tmp_path, model)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = events(done.stdout)
    uses = [
        block
        for e in seen
        if e.get("type") == "assistant"
        for block in e["message"].get("content", [])
        if block.get("type") == "tool_use"
    ]
    results = [
        block
        for e in seen
        if e.get("type") == "user"
        for block in (e["message"].get("content") or [])
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert uses and results, [e.get("type") for e in seen]
    assert {r["tool_use_id"] for r in results} & {u["id"] for u in uses}
    [final] = [e for e in seen if e.get("type") == "result"]
    assert final.get("subtype") == "success" and not final.get("is_error"), final
