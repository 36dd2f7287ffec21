"""`lanes batch`: the Batch API of a running sidecar from the command line — submit a JSONL file
of requests, follow a batch to its end, stream its output or error file, cancel it, list them.

The client key is read from `LANES_KEY` (or the variable `--key-env` names) and sent, never
printed. A batch's exit code is its ending: 0 completed (or not ended yet, without `--follow`), 1
failed, expired or cancelled; the sidecar unreachable or refusing is 1 (a 400, bad usage, 2).
How to read a batch: docs/batches.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO
from urllib.parse import quote

import httpx2

from lanes._cli_reports import SidecarRefused, UsageError, error_message

#: How a batch ends, and the exit code each ending gives.
ENDED = {"completed": 0, "failed": 1, "expired": 1, "cancelled": 1}
EVERY_S = 2.0  # how often `--follow` asks, by default
TIMEOUT_S = 30.0  # each connect, read and write; a download is streamed, so never whole
BAR_WIDTH = 24
Batch = dict[str, Any]


def add_parser(sub: Any, default_url: str) -> None:
    batch = sub.add_parser(
        "batch", help="submit a JSONL file of requests to run on free capacity; follow, read, "
        "cancel and list batches",
    )  # fmt: skip
    actions = batch.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="submit, status, results, cancel, list"
    )
    submit = actions.add_parser("submit", help="upload FILE and create a batch of its lines")
    submit.add_argument("file", metavar="FILE", help="JSONL, one request a line (OpenAI's)")
    submit.add_argument("--window", default="24h", help="completion_window: 1h to 7d, as 24h")
    submit.add_argument("--endpoint", default="/v1/chat/completions", help="every line's url")
    submit.add_argument(
        "--wait", action="store_true", help="then follow it to its end, as status --follow"
    )
    status = actions.add_parser("status", help="the batch's status and request counts")
    results = actions.add_parser("results", help="the batch's output file, streamed")
    cancel = actions.add_parser("cancel", help="cancel the batch: no item starts any more")
    for command in (status, results, cancel):
        command.add_argument("id", metavar="ID", help="the batch's id (batch_…)")
    status.add_argument("--follow", action="store_true", help="until the batch ends")
    for command in (submit, status):
        command.add_argument(
            "--every",
            type=float,
            default=EVERY_S,
            metavar="S",
            help="how often to ask while following, in seconds",
        )
    results.add_argument("--errors", action="store_true", help="its error file instead")
    results.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="write to FILE (whole, or not at all) instead of stdout",
    )
    listed = actions.add_parser("list", help="your batches, newest first")
    listed.add_argument("--limit", type=int, default=20, metavar="N", help="at most N (1 to 100)")
    for command in (submit, status, results, cancel, listed):
        command.add_argument(
            "--url", default=None, help=f"the sidecar (default: --config's address, {default_url})"
        )
        command.add_argument(
            "--config", default=None, help="a config whose [server] address the sidecar serves on"
        )
        command.add_argument(
            "--key-env", default="LANES_KEY", metavar="VAR", help="the variable holding your key"
        )
        if command is not results:
            following = " (following: an object a line)" if command in (submit, status) else ""
            command.add_argument(
                "--json",
                action="store_true",
                help=f"the sidecar's JSON{following}",
            )


def run(args: argparse.Namespace) -> int:
    """`lanes batch ACTION …`: the action's exit code."""
    if args.action in ("submit", "status") and not (math.isfinite(args.every) and args.every > 0):
        raise UsageError(f"--every must be a number of seconds above 0 (got {args.every})")
    actions: dict[str, Callable[[argparse.Namespace, httpx2.Client], int]] = {
        "submit": _submit,
        "status": _status,
        "results": _results,
        "cancel": _cancel,
        "list": _list,
    }
    with _client(args) as client:
        return actions[args.action](args, client)


# -- what is shown ---------------------------------------------------------------------------------
def _counts(batch: Batch) -> tuple[int, int, int]:
    """(completed, failed, total) of `request_counts`."""
    counts = batch.get("request_counts") or {}
    return counts.get("completed", 0), counts.get("failed", 0), counts.get("total", 0)


def line(batch: Batch) -> str:
    """`batch_… in_progress: 12 done, 1 failed of 40`."""
    done, failed, total = _counts(batch)
    return f"{batch['id']} {batch['status']}: {done} done, {failed} failed of {total}"


def bar(batch: Batch) -> str:
    """`[######..................] batch_… in_progress: 12 done, 1 failed of 40`."""
    done, failed, total = _counts(batch)
    filled = min(BAR_WIDTH, BAR_WIDTH * (done + failed) // max(1, total))
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {line(batch)}"


def _bad_lines(batch: Batch, most: int = 10) -> list[str]:
    """The lines that failed a batch at its creation (`errors`), one a line, at most `most`."""
    found = (batch.get("errors") or {}).get("data") or []
    said = [f"  line {e.get('line')}: {e.get('code')}: {e.get('message')}" for e in found[:most]]
    return said + ([f"  … {len(found) - most} more (--json)"] if len(found) > most else [])


# -- the sidecar -----------------------------------------------------------------------------------
def _client(args: argparse.Namespace) -> httpx2.Client:
    """A client of the sidecar at `--url`, naming the key in `--key-env`. Without one it names
    `none`: a sidecar without client keys takes any, and an upload must name one (so a page of
    another site can not post a form); a sidecar with keys refuses it, and `_answer` says where
    the key is read from."""
    key = os.environ.get(args.key_env, "").strip()
    return httpx2.Client(
        base_url=args.url.rstrip("/"),
        timeout=TIMEOUT_S,
        trust_env=False,
        headers={"authorization": f"Bearer {key or 'none'}"},
    )


def _answer(response: httpx2.Response, args: argparse.Namespace) -> Batch:
    """The JSON object of a 200; anything else raises `SidecarRefused` with the sidecar's own
    message (exit 2 for a 400, else 1)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and isinstance(body, dict):
        return body
    if body is None:
        said = f"{response.request.url} answered {response.status_code}, not JSON"
        raise SidecarRefused(f"{said}: is --url a lanes sidecar?", 1)
    said = error_message(body)
    if response.status_code in (401, 403):
        unset = "" if os.environ.get(args.key_env, "").strip() else ", which is not set"
        said += f" (the key is read from {args.key_env}{unset}; another variable: --key-env)"
    raise SidecarRefused(said, 2 if response.status_code == 400 else 1)


def _batch(client: httpx2.Client, args: argparse.Namespace) -> Batch:
    return _answer(client.get(_path(args.id)), args)


def _path(batch_id: str) -> str:
    """A batch's URL path: its id is one segment, never a way to another route (`../`, `?`)."""
    return f"/v1/batches/{quote(batch_id, safe='')}"


# -- the actions -----------------------------------------------------------------------------------
def _submit(args: argparse.Namespace, client: httpx2.Client) -> int:
    """Upload the file (streamed from disk), create its batch, print its id; an upload whose
    batch is refused is deleted again."""
    path = Path(args.file)
    try:
        stream = path.open("rb")
    except OSError as exc:
        raise UsageError(f"can not read {path}: {exc.strerror}") from None
    with stream:
        files = {"file": (path.name, stream, "application/jsonl")}
        upload = _answer(client.post("/v1/files", files=files, data={"purpose": "batch"}), args)
    ask = {
        "input_file_id": upload["id"],
        "endpoint": args.endpoint,
        "completion_window": args.window,
    }
    created = client.post("/v1/batches", json=ask)
    try:
        batch = _answer(created, args)
    except SidecarRefused:
        client.delete(f"/v1/files/{upload['id']}")
        raise
    print(json.dumps(batch, indent=2) if args.json else batch["id"], flush=True)
    if batch["status"] == "failed":
        bad = _bad_lines(batch)
        more = f" (and {len(bad) - 1} more: lanes batch status {batch['id']})" if bad[1:] else ""
        first = bad[0].strip() if bad else "no line was read"
        print(f"lanes: {batch['id']} failed, nothing ran: {first}{more}", file=sys.stderr)
        return 1
    if args.wait:
        return _followed(args, client, batch["id"])
    return 0


def _status(args: argparse.Namespace, client: httpx2.Client) -> int:
    if args.follow:
        return _followed(args, client, args.id)
    batch = _batch(client, args)
    print(
        json.dumps(batch, indent=2) if args.json else "\n".join([line(batch), *_bad_lines(batch)])
    )
    return ENDED.get(batch["status"], 0)


def _followed(args: argparse.Namespace, client: httpx2.Client, batch_id: str) -> int:
    """Follow a batch to its end on stdout (with `--json`, its object a line as it changes);
    the ending's exit code."""
    read = lambda: _answer(client.get(_path(batch_id)), args)  # noqa: E731
    shown = json.dumps if args.json else line
    tty = sys.stdout.isatty() and not args.json
    batch = follow(read, sys.stdout, every_s=args.every, tty=tty, shown=shown)
    if not args.json and (bad := _bad_lines(batch)):
        print("\n".join(bad))
    return ENDED[batch["status"]]


def follow(
    read: Callable[[], Batch],
    out: TextIO,
    *,
    every_s: float,
    tty: bool,
    shown: Callable[[Batch], str] = line,
    sleep: Callable[[float], None] = time.sleep,  # wall-clock: a person waits on the batch
) -> Batch:
    """`read` a batch every `every_s` until it ends (the ended batch). On a terminal, one bar
    redrawn in place (`\\r`); elsewhere a line (`shown`) each time it changes, and no `\\r`."""
    last, width = "", 0
    while True:
        batch = read()
        if tty:
            drawn = bar(batch)
            out.write("\r" + drawn.ljust(width))
            width = max(width, len(drawn))
        elif (said := shown(batch)) != last:
            out.write(said + "\n")
            last = said
        out.flush()
        if batch["status"] in ENDED:
            if tty:
                out.write("\n")
                out.flush()
            return batch
        sleep(every_s)


def _results(args: argparse.Namespace, client: httpx2.Client) -> int:
    """Stream the output (or error) file to stdout or `-o FILE` (written beside it, then moved
    into place: a download cut short leaves no half file)."""
    batch = _batch(client, args)
    kind = "error" if args.errors else "output"
    file_id, status = batch.get(f"{kind}_file_id"), batch["status"]
    if not file_id and status not in ENDED:
        raise SidecarRefused(
            f"{args.id} is {status}: its files are written when it ends "
            f"(lanes batch status {args.id} --follow)", 1,
        )  # fmt: skip
    if not file_id:  # an ending with no such line: the file is empty
        hint = " (see --errors)" if kind == "output" and _counts(batch)[1] else ""
        print(f"lanes: {args.id} ended {status} with no {kind} lines{hint}", file=sys.stderr)
        with _sink(args.output):
            return 0
    with client.stream("GET", f"/v1/files/{file_id}/content") as response:
        if response.status_code != 200:
            response.read()
            _answer(response, args)
        with _sink(args.output) as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
    return 0


@contextmanager
def _sink(output: str | None) -> Iterator[IO[bytes]]:
    """Where the bytes go: stdout, or a file written whole or not at all."""
    if output is None or output == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    path = Path(output)
    partial = path.with_name(path.name + ".part")
    try:
        opened = partial.open("wb")
    except OSError as exc:
        raise UsageError(f"can not write {path}: {exc.strerror}") from None
    try:
        with opened as out:
            yield out
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def _cancel(args: argparse.Namespace, client: httpx2.Client) -> int:
    """Cancel: `cancelling` until its running items end, then `cancelled`; an ended batch is
    shown as it is."""
    batch = _answer(client.post(f"{_path(args.id)}/cancel", json={}), args)
    print(json.dumps(batch, indent=2) if args.json else line(batch))
    return 0


def _list(args: argparse.Namespace, client: httpx2.Client) -> int:
    page = _answer(client.get("/v1/batches", params={"limit": args.limit}), args)
    rows = [
        f"{line(b)}  {b.get('endpoint', '')}  "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(b.get('created_at') or 0))}"
        for b in page.get("data", [])
    ]
    if page.get("has_more"):
        rows.append(f"… more than {args.limit} (--limit N, up to 100)")
    print(json.dumps(page, indent=2) if args.json else "\n".join(rows) or "no batches")
    return 0


__all__ = ["ENDED", "add_parser", "bar", "follow", "line", "run"]
