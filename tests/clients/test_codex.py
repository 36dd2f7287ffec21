"""OpenAI's Codex CLI (`codex exec`, the Responses wire API), unmodified, against
`lanes serve --simulate`: its first request — client_metadata, namespace tools, a web_search tool,
reasoning, include, prompt_cache_key — is served, and a whole tool loop finishes with exit 0."""

from __future__ import annotations

import subprocess

from realclients import clean_env, events, npm_client, recent_jobs

CONFIG = """\
model = "{model}"
model_provider = "lanes"

[model_providers.lanes]
name = "lanes"
base_url = "{base}"
wire_api = "responses"
env_key = "LANES_CLIENT_KEY"
"""


def run_codex(base: str, tmp_path, model: str = "auto") -> subprocess.CompletedProcess[str]:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(CONFIG.format(model=model, base=base))
    (work / "hello.txt").write_text("hello\n")
    return subprocess.run(
        [str(npm_client("codex")), "exec", "--json", "--skip-git-repo-check", "list the files"],
        cwd=work,
        env=clean_env(tmp_path, CODEX_HOME=str(home), LANES_CLIENT_KEY="unused"),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def test_codex_exec_finishes_a_tool_loop(simulated, tmp_path):
    """codex exec with its defaults: a tool call is run, its output goes back, the final answer
    ends the turn, and codex exits 0."""
    done = run_codex(simulated, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    items = [e["item"] for e in events(done.stdout) if e.get("type") == "item.completed"]
    kinds = [item.get("type") for item in items]
    assert "command_execution" in kinds, kinds  # the tool call ran
    assert kinds[-1] == "agent_message", kinds  # and the answer after its output ended the turn
    assert not [e for e in events(done.stdout) if e.get("type") in ("error", "turn.failed")]
    served = [job for job in recent_jobs(simulated) if job.get("outcome", "ok") == "ok"]
    assert len(served) >= 2  # the call, then the answer after its output
