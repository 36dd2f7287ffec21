"""The `lanes` command.

Exit codes: 0 all is well; 1 a check failed (the sidecar is unreachable or refused, a drill failed,
the canary found drift, the sidecar could not listen on its address); 2 bad usage or bad config
(an unknown flag, a config `check-config` refuses, a path that can not be written); 141 the
reader of our output went away (`lanes status | head`), quietly, as other Unix tools do. Every
failure a user can cause is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

import httpx2
import trio

from lanes import _cli_batch, _cli_reports, _cli_whatif
from lanes._cli_inputs import DISTRIBUTION, docs_page, docs_url, sidecar_url
from lanes._cli_reports import SidecarRefused, UsageError, call, error_message
from lanes._core.audit.forecast import status_lines
from lanes._core.check import check_config
from lanes._core.config.schema import packaged
from lanes._core.model.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:4098"
log = logging.getLogger("lanes")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, exit 2 (argparse's default prints the whole usage first)."""
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lanes",
        description="free-tier-first LLM routing sidecar",
        epilog=f"Every command finds its config, sidecar and audit the same way: --config, else "
        f"the config shipped with lanes; --url, else that config's address. "
        f"The documentation: {docs_url()}",
    )
    parser.add_argument("--version", action="version", version=f"lanes {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub.add_parser("serve", help="run the sidecar"))
    _remote(
        sub.add_parser(
            "status", help="lanes, breakers, backoffs, spend and the forecast of a running sidecar"
        )
    )
    reload = sub.add_parser(
        "reload", help="reload the config of a running `lanes serve --workers N` (as SIGHUP)"
    )
    reload.add_argument(
        "--accept-weaker",
        action="store_true",
        help="apply a config that lowers the guard (drops every client key or the admin key, "
        "raises the paid ceiling or the consent mode): refused without it",
    )
    _remote(reload)
    lane = sub.add_parser("lane", help="switch a lane off or on at runtime")
    lane.add_argument("action", choices=["off", "on"])
    lane.add_argument("name")
    _remote(lane)
    approvals = sub.add_parser(
        "approvals", help="list, approve or deny paid fallbacks; list and revoke grants"
    )
    approvals.add_argument(
        "action", nargs="?", default="list", choices=["list", "approve", "deny", "grants", "revoke"]
    )
    approvals.add_argument("id", nargs="?")
    approvals.add_argument(
        "--for", dest="duration", default=None, help="approve for a duration, e.g. 1h"
    )
    _remote(approvals)
    ceiling = sub.add_parser(
        "ceiling", help="show the paid terms every host sharing the state holds to, or set them"
    )
    ceiling.add_argument("action", nargs="?", default="show", choices=["show", "set"])
    ceiling.add_argument("usd", nargs="?", help="set: the daily paid ceiling, in USD")
    ceiling.add_argument(
        "--consent",
        choices=["free_tier_only", "off", "ask", "allow"],
        default=None,
        help="set: the consent mode too",
    )
    _remote(ceiling)
    canary = sub.add_parser("canary", help="the quality canary: run, pin, report, release")
    canary.add_argument("action", choices=["run", "pin", "report", "release"])
    canary.add_argument("keys", nargs="*", metavar="MODEL", help='release: "lane/model"s')
    canary.add_argument("--config", default=None, help="TOML config (default: the shipped one)")
    canary.add_argument("--canary", default=None, help="the prompt set (default: the shipped one)")
    canary.add_argument("--lane", action="append", default=[])
    canary.add_argument("--model", action="append", default=[])
    canary.add_argument("--json", action="store_true")
    canary.add_argument("--md", default=None, help="also write the report as Markdown to this file")
    drill = sub.add_parser(
        "drill", help="break things on purpose and check that startup and fallback hold"
    )
    drill.add_argument("names", nargs="*", default=["all"])
    drill.add_argument("--list", action="store_true")
    drill.add_argument("--md", action="store_true", help="with --list: as a Markdown table")
    drill.add_argument("--json", action="store_true")
    check = sub.add_parser("check-config", help="check a config file")
    check.add_argument("path")
    check.add_argument("--json", action="store_true")
    check.add_argument(
        "--connect",
        action="store_true",
        help="reach the state store too: what it is, and whether paid fallback can open",
    )
    cache = sub.add_parser("cache", help="the response cache: delete its entries")
    cache.add_argument("action", choices=["clear"])
    cache.add_argument("--client", default=None, help="only this client key's entries")
    _remote(cache)
    _cli_reports.add_parsers(sub, DEFAULT_URL)
    _cli_batch.add_parser(sub, DEFAULT_URL)
    _cli_whatif.add_parser(sub)
    init = sub.add_parser("init", help="write a starter config for the keys in the environment")
    init.add_argument("path", nargs="?", default="lanes.toml", help='where ("-" for stdout)')
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    return parser


def _serve_parser(serve: argparse.ArgumentParser) -> None:
    """The flags of `lanes serve`."""

    serve.add_argument(
        "--config", default=None, help="TOML config (default: the one shipped with lanes)"
    )
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument(
        "--simulate", action="store_true", help="route to built-in simulated providers"
    )
    serve.add_argument(
        "--state",
        default=None,
        metavar="PATH",
        help="the SQLite state file (over the config's `state`; with --simulate too): spend, "
        "quotas and the batch queue survive a restart",
    )
    serve.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="json: one object a line"
    )
    serve.add_argument(
        "--log-level",
        choices=["warning", "info", "debug"],
        default="warning",
        help="info: also one line per job (lanes.jobs) and per failed attempt",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="N processes serving the port under a parent that restarts them and reloads the "
        "config on SIGHUP (default: one process, which never reloads)",
    )


def _remote(command: argparse.ArgumentParser) -> None:
    """`--url`, `--config` and `--json`, for a command that talks to a running sidecar: after its
    own flags, which is where `--help` lists them."""
    command.add_argument(
        "--url", default=None, help=f"the sidecar (default: --config's address, {DEFAULT_URL})"
    )
    command.add_argument(
        "--config",
        default=None,
        help="a config whose [server] address the sidecar serves on (default: the shipped one)",
    )
    command.add_argument("--json", action="store_true")


def _ok(method: str, url: str, body: Any = None, *, bad_request: int = 1) -> Any:
    """The sidecar's 200 answer to `call`; anything else raises `SidecarRefused` with its message,
    exit 1 (`bad_request` for a 400)."""
    code, answer = call(method, url, body)
    if code != 200:
        raise SidecarRefused(error_message(answer), bad_request if code == 400 else 1)
    return answer


def _print(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2) if args.json else human)


def _status(args: argparse.Namespace) -> int:
    code, state = call("GET", f"{args.url}/v1/lanes")
    if code != 200:
        print(f"lanes: {args.url} answered {code}", file=sys.stderr)
        return 1
    lines = [
        f"free lane {'on' if state['free_lane'] else 'OFF'}; "
        f"paid today ${state['paid']['spent_today_usd']:.4f} "
        f"of ${state['paid']['ceiling_usd']:.2f}; fallback {state['paid']['fallback']}; "
        f"{state['approvals']} approval(s) pending"
    ]
    effective, configured = state["paid"].get("effective"), state["paid"].get("configured")
    if effective and configured and configured["ceiling_usd"] != effective["ceiling_usd"]:
        lines.append(
            f"ceiling set by {effective['ceiling_set_by']} "
            f"(this host's config: ${configured['ceiling_usd']:g})"
        )
    if refusal := state.get("clock", {}).get("refusal"):
        lines.append(f"clock: {refusal}")
    if (running := state.get("config") or {}).get("sha256"):
        line = f"config {running['sha256'][:12]}"
        if host := running.get("host"):
            workers = host.get("workers", [])
            on = sum(bool(w["serving"]) and w["sha256"] == host["sha256"] for w in workers)
            line += f" ({on}/{len(workers)} workers serving it)"
        lines.append(line)
    if "state" in state:
        store = state["state"]
        lines.append(
            f"state {store['kind']} {store['where']}: "
            f"{'up' if store['up'] else 'DOWN (paid fallback closed)'}"
        )
    for lane in state["lanes"]:
        lines += _lane_lines(lane)
    lines += [f"{name:<14} unavailable: {why}" for name, why in state["unavailable"].items()]
    if (forecast := _forecast(args.url)) is not None:
        lines += status_lines(forecast)
        state = {**state, "forecast": forecast}
    _print(args, state, "\n".join(lines))
    return 0


def _lane_lines(lane: dict[str, Any]) -> list[str]:
    """A lane's line of `lanes status`, then one for each model it lists and one for the rest."""
    lines = [
        f"{lane['name']:<14} {lane['kind']:<13} "
        f"{'off' if lane['off'] else lane['breaker']['state']}"
        + (f" — {lane['unreachable']}" if lane.get("unreachable") else "")
    ]
    for m in lane["models"]:
        extra = f" backoff {m['backoff_s']:.1f}s ({m['backoff_reason']})" if m["backoff_s"] else ""
        lines.append(
            f"    {m['model']:<28} {m['tier']:<5} "
            f"free now: {'yes' if m['free_now'] else 'no'}{extra}"
        )
    if other := lane.get("other"):
        lines.append(f"    … {other['models']} more models ({other['free_now']} free now)")
    return lines


def _forecast(url: str) -> dict[str, Any] | None:
    """The sidecar's forecast (`GET /v1/forecast`), or None from one that has none to give."""
    code, body = call("GET", f"{url}/v1/forecast")
    return body if code == 200 and isinstance(body, dict) else None


def _lane(args: argparse.Namespace) -> int:
    body = _ok("POST", f"{args.url}/v1/lanes/{args.name}/{args.action}")
    _print(args, body, f"lane {args.name}: {'off' if body['off'] else 'on'}")
    return 0


def _reload(args: argparse.Namespace) -> int:
    """`POST /v1/reload`: the parent reads and checks the file, and starts every worker on it —
    or keeps the running config and says why."""
    asked = {"accept_weaker": True} if args.accept_weaker else {}
    body = _ok("POST", f"{args.url}/v1/reload", asked)
    _print(args, body, str(body.get("message", "")))
    return 0


def _approvals(args: argparse.Namespace) -> int:
    if args.action == "list":
        code, body = call("GET", f"{args.url}/v1/approvals")
        if code != 200:
            return 1
        human = (
            "\n".join(
                f"{a['id']}  client {a['client']} → {a['candidate']} "
                f"(≤ ${a['estimated_cost_usd']:.4f})"
                for a in body["data"]
            )
            or "no pending approvals"
        )
        _print(args, body, human)
        return 0
    if args.action == "grants":
        return _grants(args)
    if not args.id:
        print(f"lanes: approvals {args.action} needs an ID", file=sys.stderr)
        return 2
    if args.action == "revoke":
        body = _ok("DELETE", f"{args.url}/v1/grants/{args.id}")
        _print(args, body, f"{args.id}: revoked")
        return 0
    decision = "deny" if args.action == "deny" else (args.duration or "once")
    body = _ok("POST", f"{args.url}/v1/approvals/{args.id}", {"decision": decision}, bad_request=2)
    _print(args, body, f"{body['id']}: {body['decision']}")
    return 0


def _grants(args: argparse.Namespace) -> int:
    body = _ok("GET", f"{args.url}/v1/grants")
    human = "\n".join(
        f"{g['id']}  {g['kind']:<8} client {g['client']}"
        + (f" → {g['candidate']}" if g["candidate"] else "")
        + f" until {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(g['until']))}"
        for g in body["data"]
    )
    _print(args, body, human or "no grants")
    return 0


def _cache(args: argparse.Namespace) -> int:
    """`lanes cache clear [--client K]` (an admin's)."""
    body = {} if args.client is None else {"client": args.client}
    done = _ok("POST", f"{args.url}/v1/cache/clear", body, bad_request=2)
    whose = "every client's" if args.client is None else f"client {args.client}'s"
    _print(args, done, f"response cache: {done['deleted']} of {whose} entries deleted")
    return 0


def _ceiling(args: argparse.Namespace) -> int:
    """`lanes ceiling [show]` and `lanes ceiling set USD [--consent MODE]` (an admin's)."""
    if args.action == "show":
        paid = _ok("GET", f"{args.url}/v1/lanes")["paid"]
    else:
        body: dict[str, Any] = {} if args.consent is None else {"consent": args.consent}
        if args.usd is not None:
            try:
                body["usd"] = float(args.usd)
            except ValueError:
                raise UsageError(f"ceiling set: {args.usd!r} is not a number of USD") from None
        if not body:
            raise UsageError("lanes ceiling set needs USD (or --consent)")
        paid = _ok("POST", f"{args.url}/v1/ceiling", body, bad_request=2)
    effective, configured = paid["effective"], paid["configured"]
    human = (
        f"paid ceiling ${effective['ceiling_usd']:g}/day (set by {effective['ceiling_set_by']}), "
        f"consent {effective['consent']} (set by {effective['consent_set_by']}); "
        f"this host's config: ${configured['ceiling_usd']:g}/day, {configured['consent']}"
    )
    _print(args, paid, human)
    return 0


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = check_config(args.path, modules_required=True)
    except ConfigError as exc:
        _print(args, {"ok": False, "error": str(exc)}, str(exc))
        return 2
    names = [lane.name for lane in config.lanes]
    found: dict[str, Any] = {"ok": True, "lanes": names}
    human = f"{args.path}: ok ({len(names)} lanes: {', '.join(names)})"
    if args.connect:
        from lanes._core.open import describe_state  # the store's modules: only when asked

        found["state"] = state = describe_state(config)
        found["ok"] = bool(state["paid_can_open"])
        human += "\n" + "\n".join(f"  {key}: {value}" for key, value in state.items())
    _print(args, found, human)
    return 0 if found["ok"] else 1


def _canary(args: argparse.Namespace) -> int:
    from lanes.canary import commands

    return commands.main(args)


def _drill(args: argparse.Namespace) -> int:
    import tempfile

    from lanes.drills.registry import summary, table
    from lanes.drills.scenarios import DRILLS, run

    if args.list:
        if args.md:
            print(table(), end="")
            return 0
        for name, fn in DRILLS.items():
            print(f"{name:<28} {summary(fn)}")
        return 0
    names = list(DRILLS) if args.names in (["all"], []) else args.names
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        print(
            f"lanes drill: no drill named {', '.join(unknown)}; see lanes drill --list",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="lanes-drill-") as tmp:
        results = trio.run(run, names, Path(tmp))
    if args.json:
        print(
            json.dumps(
                [
                    {"name": r.name, "ok": r.ok, "figure": r.figure, "detail": r.detail}
                    for r in results
                ],
                indent=2,
            )
        )
    else:
        for r in results:
            print(
                f"{'PASS' if r.ok else 'FAIL'}  {r.name:<26} {r.figure}"
                + (f"  [{r.detail}]" if r.detail else "")
            )
        print(f"{sum(r.ok for r in results)} passed, {sum(not r.ok for r in results)} failed")
    return 0 if all(r.ok for r in results) else 1


class JsonLines(logging.Formatter):
    """`--log-format json`: one JSON object a line (time, level, logger, message; and the worker,
    under `--workers`)."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker is not None:
            line["worker"] = self.worker
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(line, ensure_ascii=False)


def _logging(log_format: str, worker: int | None = None, level: str = "warning") -> None:
    handler = logging.StreamHandler()
    who = "" if worker is None else f"[worker {worker}]"
    handler.setFormatter(
        JsonLines(worker)
        if log_format == "json"
        else logging.Formatter(f"%(asctime)s %(name)s{who}: %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


def _serve(args: argparse.Namespace) -> int:
    from lanes._http.server import serve
    from lanes._http.workers import MAX_WORKERS, WORKER_ENV, run_worker, serve_workers

    if (spec := os.environ.pop(WORKER_ENV, None)) is not None:  # one of `--workers N`
        worker = json.loads(spec)
        _logging(args.log_format, worker["worker"], worker.get("log_level", "warning"))
        return run_worker(worker)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be from 1 to {MAX_WORKERS} (got {args.workers})")
    if args.workers is not None and args.state is not None:
        raise UsageError("--state is for one process; with --workers set `state` in the config")
    _logging(args.log_format, level=args.log_level)
    config = args.config or (None if args.simulate else packaged("lanes.toml"))
    if args.workers is not None:
        return trio.run(
            lambda: serve_workers(
                config,
                workers=args.workers,
                host=args.host,
                port=args.port,
                simulate=args.simulate,
                log_format=args.log_format,
                log_level=args.log_level,
            )
        )
    trio.run(
        lambda: serve(
            config,
            host=args.host,
            port=args.port,
            simulate=args.simulate,
            dedicated=True,
            state=args.state,
        )
    )
    return 0


def _init(args: argparse.Namespace) -> int:
    from lanes._core.starter import addable, starter_config

    reference = docs_page("reference/config")
    text, names = starter_config(os.environ, path=args.path, reference=reference)
    if args.path == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.path)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    path.write_text(text, encoding="utf-8")
    print(
        f"wrote {path}: {len(names)} lanes ({', '.join(names) or 'none'}); "
        f"check it with `lanes check-config {path}`, run it with `lanes serve --config {path}`"
    )
    if more := addable(os.environ):
        print("free lanes a key would add (set the variable, then `lanes init --force`):")
        for name, variable, what in more:
            print(f"  {name:<12} ${variable:<22} {what}")
    print(f"every key of the config: {reference}")
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups; `exc` itself when it is no group."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _one_line(exc: BaseException, args: argparse.Namespace) -> tuple[str, int] | None:
    """What to say about a failure a user can cause, and the exit code; None for a bug."""
    if isinstance(exc, (ConfigError, UsageError)):
        return str(exc), 2
    if isinstance(exc, SidecarRefused):
        return str(exc), exc.code
    if isinstance(exc, httpx2.TransportError):
        url = getattr(args, "url", "?")
        return (
            f"can not reach the sidecar at {url} ({type(exc).__name__}): start one with "
            "`lanes serve`, or pass --url URL (or --config FILE: its [server] address)",
            1,
        )
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
        what = "is in use" if exc.errno == errno.EADDRINUSE else "is not an address of this host"
        host, port = getattr(args, "host", None), getattr(args, "port", None)
        where = f"{host or 'server.host'}:{port or 'server.port'}"
        return f"can not listen on {where}: the address {what}; pick another with --port", 1
    if isinstance(exc, OSError) and exc.errno == errno.EACCES and args.command == "serve":
        return f"can not listen or write: permission denied ({exc.filename or exc})", 2
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"can not write {exc.filename}: {exc.strerror}", 2
    if type(exc).__name__ == "OperationalError":  # sqlite3's, for a state file it can not open
        return f"the state file can not be opened ({exc}); check `state` in the config", 2
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(_parser().parse_args(argv))
    except BrokenPipeError:
        # the reader went away (`lanes status | head`): stop quietly, and keep Python's own
        # flush at exit from failing on the same closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130


#: The commands whose `--url` is a choice: without it they read a state file (`_cli_inputs`).
_AUDIT_READERS = ("report", "explain")


def _run(args: argparse.Namespace) -> int:
    handlers = {
        "serve": _serve,
        "status": _status,
        "lane": _lane,
        "reload": _reload,
        "approvals": _approvals,
        "ceiling": _ceiling,
        "cache": _cache,
        "check-config": _check_config,
        "canary": _canary,
        "drill": _drill,
        "report": _cli_reports.run_report,
        "explain": _cli_reports.run_explain,
        "whatif": _cli_whatif.run,
        "batch": _cli_batch.run,
        "init": _init,
    }
    try:
        if hasattr(args, "url") and args.url is None and args.command not in _AUDIT_READERS:
            # the sidecar of --config, else of the shipped config
            args = argparse.Namespace(**{**vars(args), "url": sidecar_url(args)})
        return handlers[args.command](args)
    except BrokenPipeError:
        raise
    except (Exception, BaseExceptionGroup) as exc:
        said = [one for leaf in _leaves(exc) if (one := _one_line(leaf, args)) is not None]
        if not said:
            raise  # a bug: the traceback is the report
        print(f"lanes: {said[0][0]}", file=sys.stderr)
        return said[0][1]


if __name__ == "__main__":
    sys.exit(main())
