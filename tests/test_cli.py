"""The `lanes` command as a user meets it: one line for every failure they can cause, the exit code
README documents, never a traceback."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import lanes_command
from lanes._cli import JsonLines, main
from lanes.harness.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


def lanes_cli(*argv: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lanes", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        **kw,
    )


def one_line(text: str) -> str:
    """The single line a failure prints, asserting it is one line and no traceback."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.slow
def test_version():
    """`lanes --version` names the installed version."""
    done = lanes_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("lanes 0.")


@pytest.mark.slow
def test_a_bad_flag_is_one_line_and_exit_2():
    """An unknown flag or a missing argument: one line naming it, exit 2."""
    done = lanes_cli("serve", "--bogus")
    assert done.returncode == 2
    assert one_line(done.stderr) == "lanes: unrecognized arguments: --bogus (see lanes --help)"
    with pytest.raises(SystemExit) as caught:
        main(["lane", "sideways", "x"])
    assert caught.value.code == 2


@pytest.mark.slow
def test_simulate_refuses_a_public_bind_with_exit_2():
    """`serve --simulate --host 0.0.0.0` is refused before anything starts: one line, exit 2."""
    done = lanes_cli("serve", "--simulate", "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "server.host: refusing to bind 0.0.0.0 with no client keys" in one_line(done.stderr)


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_1():
    """A port another process holds: one line saying so, exit 1; logs as JSON lines on request."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = lanes_cli("serve", "--simulate", "--port", str(port), "--log-format", "json")
    assert done.returncode == 1, done.stderr
    *logs, last = done.stderr.strip().splitlines()
    assert last == (
        f"lanes: can not listen on server.host:{port}: the address is in use; "
        "pick another with --port"
    )
    assert logs and all(json.loads(line)["logger"].startswith("lanes") for line in logs)
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_unwritable_paths_are_one_line_and_exit_2(tmp_path):
    """A path that can not be written — the canary's Markdown report, init's output — is one line
    naming it, exit 2, and nothing else is changed."""
    config = tmp_path / "lanes.toml"
    config.write_text(f'state = "{tmp_path / "s.db"}"\n')
    done = lanes_cli("canary", "report", "--config", str(config), "--md", "/no/dir/x.md")
    assert done.returncode == 2 and "can not write /no/dir/x.md" in one_line(done.stderr)
    done = lanes_cli("init", "/no/dir/lanes.toml")
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        "lanes: can not write /no/dir/lanes.toml: No such file or directory"
    )


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly():
    """A reader that went away (`lanes … | head`): exit 141, no BrokenPipeError traceback."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "lanes", "init", "-"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == ""


@pytest.mark.slow
def test_an_unreachable_sidecar_is_one_line_and_exit_1():
    """`lanes status` against nothing: one line naming the URL, exit 1."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = lanes_cli("status", "--url", f"http://127.0.0.1:{port}")
    assert done.returncode == 1
    assert one_line(done.stderr).startswith(
        f"lanes: can not reach the sidecar at http://127.0.0.1:{port}"
    )


def test_json_log_lines():
    """`--log-format json`: one JSON object a line with time, level, logger and message."""
    import logging

    record = logging.LogRecord("lanes", logging.WARNING, __file__, 1, "lane %s: off", ("g",), None)
    line = json.loads(JsonLines().format(record))
    assert line["level"] == "warning" and line["logger"] == "lanes"
    assert line["message"] == "lane g: off" and line["time"]


@pytest.mark.slow
def test_init_writes_a_starter_config_for_the_keys_found(tmp_path):
    """`lanes init` names the local lanes and the lanes whose keys are set — never a key's value —
    and the file passes check-config; an existing file is kept unless --force."""
    env = {"PATH": os.environ["PATH"], "GROQ_API_KEY": "sk-secret-1", "OPENAI_API_KEY": "sk-2"}
    done = lanes_cli("init", "mine.toml", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "mine.toml").read_text()
    assert 'name = "groq"' in text and 'name = "openai"' in text and 'name = "ollama"' in text
    assert 'name = "gemini"' not in text and "sk-secret" not in text and "sk-2" not in text
    assert text.index('"ollama"') < text.index('"groq"') < text.index('"openai"')
    assert lanes_cli("check-config", str(tmp_path / "mine.toml"), env=env).returncode == 0
    again = lanes_cli("init", "mine.toml", cwd=tmp_path, env=env)
    assert again.returncode == 2 and "exists; pass --force" in one_line(again.stderr)


def test_make_run_takes_a_port():
    """`make run PORT=…` passes the port to `lanes serve`."""
    done = subprocess.run(
        ["make", "-n", "run", "PORT=4111"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "lanes serve --simulate --port 4111" in done.stdout


def test_check_config_connect_says_what_the_store_is_and_whether_paid_can_open(
    redis_server, tmp_path, capsys
):
    """`lanes check-config --connect` reaches the state store: for Redis its version, role,
    eviction policy, replicas, persistence and whether paid can open (exit 0), or why not (exit
    1: an evicting policy, fewer replicas than asked for, no server); the password never shown."""
    import redis

    def check(state: str, **top: object) -> tuple[int, dict[str, object], str]:
        path = tmp_path / "lanes.toml"
        extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in top.items())
        path.write_text(f'state = "{state}"\n{extra}')
        code = main(["check-config", str(path), "--connect", "--json"])
        shown = capsys.readouterr().out
        code_human = main(["check-config", str(path), "--connect"])
        assert code_human == code
        return code, json.loads(shown)["state"], capsys.readouterr().out

    url = redis_server.url.replace("redis://", "redis://:hunter2@")
    redis.Redis.from_url(redis_server.url).config_set("requirepass", "hunter2")
    code, state, human = check(url)
    assert code == 0 and state["paid_can_open"] is True and state["role"] == "master"
    assert state["maxmemory_policy"] == "noeviction" and state["replicas"] == 0
    assert str(state["version"]).startswith("7.") and state["appendonly"] is False
    assert "hunter2" not in human and "maxmemory_policy: noeviction" in human
    code, state, _ = check(url, state_redis_min_replicas=1)
    assert code == 1 and "0 replica(s) connected" in str(state["why_not"])
    redis.Redis.from_url(url).config_set("maxmemory-policy", "allkeys-lru")
    code, state, human = check(url)
    assert code == 1 and "allkeys-lru" in str(state["why_not"]) and "paid_can_open: False" in human
    code, state, _ = check(f"redis://127.0.0.1:{free_port()}/0")
    assert code == 1 and state["paid_can_open"] is False and state["why_not"]
    code, state, _ = check(str(tmp_path / "state.db"))
    assert code == 0 and state["kind"] == "sqlite"


def test_init_lists_the_variables_that_would_add_each_free_lane(tmp_path, monkeypatch):
    """`lanes init` names, for each free lane whose key is not set, the variable that would add
    it — in the file and on the terminal — and points to the configuration reference that
    exists (the docs' page, which docs/ holds)."""
    from lanes._cli_inputs import docs_page, docs_url

    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_TOKEN")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GEMINI_API_KEY", "sk-secret-3")
    monkeypatch.chdir(tmp_path)
    done = lanes_command("init", "mine.toml")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "mine.toml").read_text()
    for lane, variable in (("groq", "GROQ_API_KEY"), ("cerebras", "CEREBRAS_API_KEY")):
        assert re.search(rf"^#\s+{lane}\s+\${variable}\s", text, re.M), text
        assert re.search(rf"^\s+{lane}\s+\${variable}\s", done.stdout, re.M), done.stdout
    assert "$GEMINI_API_KEY " not in text.split("More free lanes")[1]
    assert "sk-secret" not in text + done.stdout
    reference = docs_page("reference/config")
    assert reference in text and f"every key of the config: {reference}" in done.stdout
    assert "README's configuration reference" not in text
    page = reference.removeprefix(docs_url().rstrip("/") + "/").rstrip("/")
    assert (ROOT / "docs" / f"{page.removesuffix('.md')}.md").is_file()
