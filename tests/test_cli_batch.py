"""`lanes batch` against a real sidecar over fake providers: submit a JSONL file, follow the
batch, read its output and error files, cancel it, list them; one line on stderr and the exit
code README documents for every failure a user can cause (an unknown id, a refused window, a bad
line, a sidecar not there, a missing key)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio

from lanes._cli import main
from lanes._cli_batch import follow
from lanes.harness.processes import free_port
from lanes.testing import rate_limited
from sidecar import open_sidecar

KEYS = {"A_KEY": "client-a-key-0123456789abcdef", "B_KEY": "client-b-key-0123456789abcdef"}


@attrs.frozen
class Done:
    """What a `lanes` run left: its exit code, stdout and stderr."""

    code: int
    out: str
    err: str


def line(custom_id: str, model: str = "free-model") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": f"classify {custom_id}"}]}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def jsonl(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def run_lanes(capsys: Any, *argv: str) -> Done:
    """`lanes ARGV` run in a worker thread (the sidecar keeps serving on this one), bounded."""
    capsys.readouterr()
    with trio.fail_after(30):
        code = await trio.to_thread.run_sync(main, list(argv), abandon_on_cancel=True)
    said = capsys.readouterr()
    return Done(code, said.out, said.err)


def one_line(text: str) -> str:
    """The single line a failure prints, asserting it is one line and no traceback."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


async def test_submit_follow_and_read_the_results(tmp_path, capsys):
    """The id `submit` prints is the one `status --follow` follows to `completed` (plain lines, no
    `\\r`, exit 0); `results` writes OpenAI's output lines by custom_id, `--errors -o` the item
    the paid model refused; `list` shows the batch."""
    # an owned local lane: it serves with FREE_LANE=off too
    specs = ("local", "local", ["free-model"]), ("paid", "paid", ["paid-model"])
    file = jsonl(tmp_path, line("r1"), line("r2"), line("r3", model="paid-model"))
    async with open_sidecar(*specs) as (url, fakes):
        at = ["--url", url.removesuffix("/v1")]
        submitted = await run_lanes(capsys, "batch", "submit", file, *at)
        assert (submitted.code, submitted.err) == (0, "")
        batch_id = submitted.out.strip()
        assert batch_id.startswith("batch_") and "\n" not in batch_id

        followed = await run_lanes(
            capsys, "batch", "status", batch_id, "--follow", "--every", "0.05", *at
        )
        assert followed.code == 0 and "\r" not in followed.out
        shown = followed.out.splitlines()
        assert all(s.startswith(f"{batch_id} ") for s in shown)
        assert len(shown) == len(set(shown))  # a line only when something changed
        assert shown[-1] == f"{batch_id} completed: 2 done, 1 failed of 3"
        status = await run_lanes(capsys, "batch", "status", batch_id, *at)
        assert (status.code, status.out) == (0, f"{batch_id} completed: 2 done, 1 failed of 3\n")

        results = await run_lanes(capsys, "batch", "results", batch_id, *at)
        assert results.code == 0
        out = [json.loads(x) for x in results.out.splitlines()]
        assert sorted(x["custom_id"] for x in out) == ["r1", "r2"]
        for x in out:
            assert x["id"].startswith(batch_id) and x["error"] is None
            assert x["response"]["status_code"] == 200
            assert x["response"]["body"]["object"] == "chat.completion"
        target = tmp_path / "errors.jsonl"
        errors = await run_lanes(
            capsys, "batch", "results", batch_id, "--errors", "-o", str(target), *at
        )
        assert (errors.code, errors.out) == (0, "")
        (refused,) = [json.loads(x) for x in target.read_text().splitlines()]
        assert refused["custom_id"] == "r3" and refused["response"]["status_code"] >= 400
        assert sorted(p.name for p in tmp_path.iterdir()) == ["errors.jsonl", "in.jsonl"]

        listed = await run_lanes(capsys, "batch", "list", *at)
        assert listed.code == 0
        assert one_line(listed.out).startswith(f"{batch_id} completed: 2 done, 1 failed of 3  ")
        assert fakes["paid"].requests() == []


@pytest.mark.slow
async def test_submit_wait_in_a_pipe_prints_plain_lines(tmp_path):
    """`python -m lanes batch submit --wait`, its stdout a pipe: the id, then a line per change
    ending `completed`, no `\\r` (no bar for a file or a pipe), exit 0."""
    async with open_sidecar(("local", "local", ["free-model"])) as (url, _):
        file = jsonl(tmp_path, line("a"), line("b"))
        argv = ["batch", "submit", file, "--wait", "--every", "0.05", "--url", url[: -len("/v1")]]
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-m", "lanes", *argv],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert b"\r" not in done.stdout
    batch_id, *shown = out.splitlines()
    assert batch_id.startswith("batch_")
    assert shown[-1] == f"{batch_id} completed: 2 done, 0 failed of 2"


async def test_cancel_ends_the_batch_cancelled_and_its_items_say_so(tmp_path, capsys):
    """A batch waiting for a free quota's reset (an hour away) is cancelled: `cancel` shows it
    cancelling or cancelled, `status --follow` ends at `cancelled` with exit 1, the error file
    has a `batch_cancelled` line per item and the output file none."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=3600))
        at = ["--url", url.removesuffix("/v1")]
        submitted = await run_lanes(
            capsys, "batch", "submit", jsonl(tmp_path, line("x"), line("y")), *at
        )
        batch_id = submitted.out.strip()
        cancelled = await run_lanes(capsys, "batch", "cancel", batch_id, *at)
        assert cancelled.code == 0
        assert one_line(cancelled.out).split(":")[0] in (
            f"{batch_id} cancelling",
            f"{batch_id} cancelled",
        )
        followed = await run_lanes(
            capsys, "batch", "status", batch_id, "--follow", "--every", "0.05", *at
        )
        assert followed.code == 1
        assert followed.out.splitlines()[-1] == f"{batch_id} cancelled: 0 done, 2 failed of 2"
        errors = await run_lanes(capsys, "batch", "results", batch_id, "--errors", *at)
        assert errors.code == 0
        codes = {json.loads(x)["custom_id"]: json.loads(x)["error"]["code"]
                 for x in errors.out.splitlines()}  # fmt: skip
        assert codes == {"x": "batch_cancelled", "y": "batch_cancelled"}
        output = await run_lanes(capsys, "batch", "results", batch_id, *at)
        assert (output.code, output.out) == (0, "")
        assert one_line(output.err) == (
            f"lanes: {batch_id} ended cancelled with no output lines (see --errors)"
        )


async def test_an_unknown_batch_is_one_line_and_exit_1(capsys):
    """`status`, `results` and `cancel` of an id the sidecar does not know: the sidecar's own
    message on one line, exit 1, nothing on stdout."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, _):
        for action in ("status", "results", "cancel"):
            done = await run_lanes(
                capsys, "batch", action, "batch_nope", "--url", url.removesuffix("/v1")
            )
            assert (done.code, done.out) == (1, ""), action
            assert one_line(done.err) == "lanes: no batch 'batch_nope'"


async def test_a_refused_batch_says_the_servers_message_and_leaves_no_file(tmp_path, capsys):
    """A window the sidecar refuses (a 400): its message on one line, exit 2, and the file just
    uploaded is deleted again."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, _):
        at = ["--url", url.removesuffix("/v1")]
        done = await run_lanes(
            capsys, "batch", "submit", jsonl(tmp_path, line("a")), "--window", "9d", *at
        )
        assert (done.code, done.out) == (2, "")
        assert one_line(done.err).startswith("lanes: completion_window must be a duration from 1h")
        async with httpx2.AsyncClient(headers={"authorization": "Bearer any"}) as client:
            files = (await client.get(f"{url}/files")).json()
        assert files["data"] == []
        listed = await run_lanes(capsys, "batch", "list", *at)
        assert (listed.code, listed.out) == (0, "no batches\n")


async def test_a_file_with_a_bad_line_prints_the_id_and_names_the_line(tmp_path, capsys):
    """A line that is not JSON fails the batch at once: the id on stdout, one line on stderr
    naming line 2, exit 1; `status` lists the bad line and exits 1."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, fakes):
        at = ["--url", url.removesuffix("/v1")]
        done = await run_lanes(
            capsys, "batch", "submit", jsonl(tmp_path, line("a"), "{not json"), *at
        )
        assert done.code == 1
        batch_id = done.out.strip()
        said = one_line(done.err)
        assert said.startswith(f"lanes: {batch_id} failed, nothing ran: line 2: ")
        status = await run_lanes(capsys, "batch", "status", batch_id, *at)
        assert status.code == 1
        first, *bad = status.out.splitlines()
        assert first == f"{batch_id} failed: 0 done, 0 failed of 0"
        assert len(bad) == 1 and bad[0].startswith("  line 2: ")
        assert fakes["free"].requests() == []


async def test_the_key_comes_from_its_variable_and_is_never_shown(tmp_path, capsys, monkeypatch):
    """On a sidecar with client keys: without `LANES_KEY` the refusal names the variable, not a
    key; `--key-env A_KEY` submits as client a; client b (`--key-env B_KEY`) gets a 404 for it;
    no key is ever printed."""
    monkeypatch.delenv("LANES_KEY", raising=False)
    for name, key in KEYS.items():
        monkeypatch.setenv(name, key)
    server = {"clients": {"a": "A_KEY", "b": "B_KEY"}}
    async with open_sidecar(("free", "free", ["free-model"]), server=server, env=KEYS) as (url, _):
        at, file = ["--url", url.removesuffix("/v1")], jsonl(tmp_path, line("a"))
        refused = await run_lanes(capsys, "batch", "submit", file, *at)
        assert refused.code == 1
        assert one_line(refused.err) == (
            "lanes: unknown client key (the key is read from LANES_KEY, which is not set; "
            "another variable: --key-env)"
        )
        submitted = await run_lanes(capsys, "batch", "submit", file, "--key-env", "A_KEY", *at)
        assert submitted.code == 0
        batch_id = submitted.out.strip()
        other = await run_lanes(capsys, "batch", "status", batch_id, "--key-env", "B_KEY", *at)
        assert other.code == 1 and one_line(other.err) == f"lanes: no batch {batch_id!r}"
        said = refused.out + refused.err + submitted.out + submitted.err + other.out + other.err
        assert not any(key in said for key in KEYS.values())


async def test_a_sidecar_not_there_a_missing_file_and_a_bad_flag(tmp_path, capsys):
    """Nothing listening at --url: one line, exit 1; a file that is not there, or `--every 0`:
    one line, exit 2."""
    at = ["--url", f"http://127.0.0.1:{free_port()}"]
    done = await run_lanes(capsys, "batch", "list", *at)
    assert done.code == 1
    assert one_line(done.err).startswith(
        f"lanes: can not reach the sidecar at {at[1]} (ConnectError): start one with `lanes serve`"
    )
    missing = await run_lanes(capsys, "batch", "submit", str(tmp_path / "nope.jsonl"), *at)
    assert missing.code == 2
    assert (
        one_line(missing.err)
        == f"lanes: can not read {tmp_path / 'nope.jsonl'}: No such file or directory"
    )
    every = await run_lanes(capsys, "batch", "status", "batch_x", "--every", "0", *at)
    assert (every.code, one_line(every.err)) == (
        2,
        "lanes: --every must be a number of seconds above 0 (got 0.0)",
    )


def batch(status: str, done: int, failed: int = 0, total: int = 4) -> dict[str, Any]:
    counts = {"completed": done, "failed": failed, "total": total}
    return {"id": "batch_1", "status": status, "request_counts": counts}


def test_on_a_terminal_one_bar_is_redrawn_in_place():
    """On a terminal each read redraws one bar after `\\r`, and the line ends once, at the end;
    elsewhere a line is written only when the batch changed, never a `\\r`."""
    reads = [batch("in_progress", 0), batch("in_progress", 0), batch("in_progress", 2, 1),
             batch("completed", 3, 1)]  # fmt: skip
    slept: list[float] = []
    out = io.StringIO()
    ended = follow(iter(reads).__next__, out, every_s=0.5, tty=True, sleep=slept.append)
    assert ended == reads[-1] and slept == [0.5, 0.5, 0.5]
    drawn = out.getvalue()
    assert drawn.count("\r") == 4 and drawn.count("\n") == 1 and drawn.endswith("\n")
    assert drawn.split("\r")[-1].rstrip() == (
        "[########################] batch_1 completed: 3 done, 1 failed of 4"
    )
    assert "[##################......] batch_1 in_progress: 2 done, 1 failed of 4" in drawn

    plain = io.StringIO()
    follow(iter(reads).__next__, plain, every_s=0.5, tty=False, sleep=lambda _: None)
    assert plain.getvalue() == (
        "batch_1 in_progress: 0 done, 0 failed of 4\n"
        "batch_1 in_progress: 2 done, 1 failed of 4\n"
        "batch_1 completed: 3 done, 1 failed of 4\n"
    )


async def test_an_id_is_one_segment_of_the_path_never_another_route(capsys):
    """Hostile review: the id was put in the URL as it came, so `lanes batch cancel
    '../../v1/lanes/local/off?x='` posted to the lane switch, with the user's key (an admin's,
    maybe), and switched the lane off. An id is one path segment: no such route."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        done = await run_lanes(capsys, "batch", "cancel", "../../v1/lanes/local/off?x=",
                               "--url", url.removesuffix("/v1"))  # fmt: skip
        fakes["local"].script("local-model")
        async with httpx2.AsyncClient() as http:
            asked = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
            served = await http.post(f"{url}/chat/completions", json=asked)
    assert done.code == 1 and one_line(done.err).startswith("lanes: no ")
    assert served.status_code == 200  # the lane still serves
