"""docs/benchmarks.md's sections on work that can wait: the batch over a simulated day
(`bench/batchday.py`, with its diagnoses) and items through the sidecar's queue
(`bench/batch100k.py`) — from a run's JSON, or the newest in bench/results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PROBE = "one at a time, 20 ms apart, for 15 s"  # bench/batch100k.py's probe


def sections(data: Mapping[str, Any]) -> list[str]:
    """Both sections: this run's figures where it has them, else the newest full runs'."""
    day = data.get("batchday")
    newest, diagnoses = latest_day()
    if day is None:
        day = newest
    if day is None or newest is None or newest["date"] != day["date"] or day["hours"] < 24:
        diagnoses = {}
    return day_section(day, diagnoses) + queue_section(data.get("batch100k") or latest_queue())


def latest_day() -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """The newest full `batchday` run, and the diagnoses of its date: `backoff` (a full day with
    the pause capped), `quick` and `concurrency` (2-hour days at the default and another
    `[batch] concurrency`)."""
    runs = sorted(RESULTS.glob("batchday-2???-??-??.json"))
    if not runs:
        return None, {}
    day = json.loads(runs[-1].read_text())
    found = {}
    for key, pattern in (
        ("backoff", "-backoff*"),
        ("quick", "-quick"),
        ("concurrency", "-quick-concurrency*"),
    ):
        paths = sorted(RESULTS.glob(f"batchday-{day['date']}{pattern}.json"))
        if paths:
            found[key] = json.loads(paths[-1].read_text())
    return day, found


def latest_queue() -> dict[str, Any] | None:
    """The newest full `batch100k` run."""
    runs = sorted(RESULTS.glob("batch100k-2???-??-??.json"))
    return json.loads(runs[-1].read_text()) if runs else None


def _clock(seconds: float | None) -> str:
    """Seconds after midnight as `6 h 35 min`."""
    if seconds is None:
        return "—"
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"


# -- a batch over a simulated day ------------------------------------------------------------------
def day_section(d: Mapping[str, Any] | None, diagnoses: Mapping[str, Any]) -> list[str]:
    if not d:
        return []
    b, alone, beside = d["batch"], d["interactive_alone"], d["interactive_with_batch"]
    wall = d["simulation_wall_s"]
    lines = [
        f"## Work that can wait: a {b['items']:,}-item batch over a simulated day",
        "",
        f"`python -m bench.batchday` on {d['date']} (commit {d['commit']}, 2 cores), one run "
        "with the batch and one without on the same arrivals, on trio's virtual clock (two "
        f"processes at once: {wall['with_batch']:.0f} s and {wall['alone']:.0f} s of wall "
        "time). A library "
        '`dispatcher.submit_batch(jobs, window="24h")` (`[batch]` defaults: headroom '
        f"{b['headroom']:.0%}, concurrency 4) is submitted at a UTC midnight beside the free "
        f"share's interactive traffic ({alone['jobs']:,} jobs, which may fall back to a paid "
        "lane), over the same five free fakes. The bound: no scheduler can serve more items "
        "free under lanes' headroom rule over the same arrivals, the interactive jobs served "
        "free first wherever a quota has room (`bench/batchbound.py` says exactly what it "
        "assumes). Two bounds are computed and the lesser shown: a max-flow "
        "(`bench/batchbound.py`, beside it) and a mixed-integer program solved by HiGHS "
        "(`bench/batchexact.py`: every rule of the model, only the requests' whole numbers "
        f"relaxed; {_tight(b)}). The oracle's schedule — the batch at every reset to the "
        "rule's share, each interactive job placed, when one has room, on a quota the batch is "
        "done with — serves the figure beside it, so the best lies between. The rule's "
        "ceiling is the bound with no interactive traffic.",
        "",
        "| items | served free | bound | share of the bound | the max-flow bound, share | the "
        "oracle's schedule | the rule's ceiling | paid | last served free | the oracle's last | "
        "minutes with an item served / up to the last |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {b['items']:,} | {b['free']:,} ({b['free_share']:.1%}) | {b['bound']:,} "
        f"({b['bound_share']:.1%}) | {b['share_of_bound']:.2%} | {_max_flow(b)} | "
        f"{b['oracle']:,} | "
        f"{b['ceiling']:,} | {b['paid']} (${b['paid_usd']:.2f}; {b['paid_requests']} requests "
        f"to the paid lane) | {_clock(b['finish_s'])} | {_clock(b['oracle_finish_s'])} | "
        f"{b['minutes_served']} / {b['minutes_to_finish']} |",
        "",
        "| provider | the rule's share: a minute, a day | served | the oracle's schedule | most "
        "in a minute | served over the rule: minute, day | its 429s: minute, day |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in b["per_provider"].items():
        lines.append(
            f"| {name} | {p['r']}, {p['d']:,} | {p['served']:,} | {p['oracle']:,} | "
            f"{p['max_in_a_minute']} | {p['over_minute']}, {p['over_day']} | "
            f"{p['refused']['minute']}, {p['refused']['day']} |"
        )
    lines += [
        "",
        "| interactive jobs | free | paid, spend | wall time a job p50 / p99 (ms) | virtual "
        "time a job p50 / p99 / max (ms) |",
        "|---|---|---|---|---|",
    ]
    for label, i in (("without the batch", alone), ("beside the batch", beside)):
        lines.append(
            f"| {label} | {i['free']:,} ({i['free_share']:.1%}) | {i['paid']:,}, "
            f"${i['paid_usd']:.4f} | {i['wall_p50_ms']:.2f} / {i['wall_p99_ms']:.2f} | "
            f"{i['virtual_p50_ms']:.0f} / {i['virtual_p99_ms']:.0f} / {i['virtual_max_ms']:.0f} |"
        )
    lines += ["", *_pace(b, diagnoses.get("backoff")), ""]
    lines += _over_the_rule(b, diagnoses.get("quick"), diagnoses.get("concurrency"))
    lines += [*_beside(alone, beside), ""]
    return lines


def _tight(b: Mapping[str, Any]) -> str:
    """How the program's bound was found."""
    t = b.get("tight")
    if not t:
        return "not run"
    how = "proved optimal" if t["optimal"] else "the solver's proven bound at its time limit"
    return (
        f"{t['upper']:,}, {how} in {t['seconds']:.0f} s, free-first routing modelled minute by "
        f"minute for the first {t['horizon']}"
    )


def _max_flow(b: Mapping[str, Any]) -> str:
    if "max_flow" not in b:
        return "—"
    return f"{b['max_flow']:,}, {b['share_of_max_flow']:.1%}"


def _pace(b: Mapping[str, Any], capped: Mapping[str, Any] | None) -> list[str]:
    """Where the batch stands against the bound and the oracle's schedule, and why."""
    text = (
        f"The bound is an upper limit, not a schedule; the oracle's own schedule serves "
        f"{b['oracle']:,}, so lanes served {b['share_of_oracle']:.1%} of what it does (over 100 % "
        "where a provider's items started past the rule: below). The batch was served in "
        f"{b['minutes_served']} of the {b['minutes_to_finish']} minutes up to its last item. An "
        'item told "not now" is put back until its Retry-After — the reset of the quota that '
        "refused it — and no other job of its model is tried before then (`batch/library.py`), "
        "so at each reset the items start at once, ahead of that minute's interactive jobs: the "
        f"dispatcher was asked {b['tries']:,} times for the batch's {b['free']:,} answers. While "
        "the batch has items left, an interactive job goes first to a quota the batch may not "
        "use again today, then to the one it would use up first (`[batch] spare`, "
        f"`engine/backlog.py`): {b['interactive_before_done']:,} interactive jobs were served "
        "where the batch was not done yet, against "
        f"{b['oracle_interactive_before_done']:,} in the oracle's schedule."
    )
    if capped:
        x, cap = capped["batch"], capped["changed"]["backoff_cap_s"]
        text += (
            f" With the pause between tries capped at {cap:g} s (`--backoff-cap {cap:g}`, a "
            f"diagnosis): {x['free']:,} items free ({x['share_of_bound']:.1%} of the bound), "
            f"{x['tries']:,} tries."
        )
    return [text]


def _over_the_rule(
    b: Mapping[str, Any], quick: Mapping[str, Any] | None, other: Mapping[str, Any] | None
) -> list[str]:
    """Where the batch took more of a quota than the rule leaves it, and (from 2-hour days at
    the default and another concurrency) why."""
    lines = []
    for name, p in b["per_provider"].items():
        if not (p["over_minute"] or p["over_day"]):
            continue
        text = (
            f"On {name}, whose limits our config does not know (its headers report the "
            f"minute's), {p['over_minute']} items started after the minute's use had reached "
            f"the rule's {p['r']}, and {p['refused']['minute']} batch requests were refused by "
            "its minute quota (429): there the headroom is read from what the provider last "
            "reported, less the requests sent since that its answers have not reported on "
            "(`freetier/unreported.py`)."
        )
        if quick and other and name in quick["batch"]["per_provider"]:
            q, o = quick["batch"]["per_provider"][name], other["batch"]["per_provider"][name]
            n = other["changed"]["concurrency"]
            text += (
                f" In a 2-hour day (`python -m bench.batchday --quick`, 1,000 items) at "
                f"concurrency 4: {q['over_minute']} over the rule and {q['refused']['minute']} "
                f"refused; at {n} (`--quick --concurrency {n}`): {o['over_minute']} and "
                f"{o['refused']['minute']}."
            )
        lines += [text, ""]
    return lines


def _beside(alone: Mapping[str, Any], beside: Mapping[str, Any]) -> list[str]:
    return [
        "The interactive jobs ask more than the free quotas hold, so every item the batch serves "
        "free is a free request they no longer find later in the day: "
        f"{alone['free'] - beside['free']:,} fewer of them were served free and "
        f"{beside['paid'] - alone['paid']:,} more paid "
        f"(+${beside['paid_usd'] - alone['paid_usd']:.4f}); none failed. On the virtual clock a "
        "job meets the batch's work only when both fall on the same instant, so its wall time "
        "is the dispatcher's own work and its virtual time any wait (none here); interactive "
        "requests beside a batch in real time are measured in the next section."
    ]


# -- items through the sidecar's queue -------------------------------------------------------------
def queue_section(d: Mapping[str, Any] | None) -> list[str]:
    if not d:
        return []
    i, alone = d["interactive"], d["probe_alone"]
    runs = [d[k] for k in ("10000", "100000") if k in d]
    lines = [
        "## Items through the sidecar's durable queue",
        "",
        f"`python -m bench.batch100k` on {d['date']} (commit {d['commit']}, 2 cores), one run: "
        "`lanes serve` with its state and batch queue in SQLite files, over one local lane (a "
        "`lanes.testing` fake on 127.0.0.1, in the load generator's process) at `[batch] "
        f"concurrency` {d['concurrency']}. Each JSONL file is uploaded over HTTP, its batch "
        "created and run to its end (cancelled only past an hour: the table's `then` says), "
        "and its output and error files streamed back. CPU is the sidecar's user + system "
        f"time {'(its CPU clock)' if d.get('cpu_clock') == 'process' else 'from /proc'}, "
        "an item's beside the same "
        "body sent as an ordinary request at the same concurrency "
        f"({i['cpu_ms_per_request']:.2f} ms of CPU each, over {i['requests']:,}): the "
        "difference is the queue's own cost. The fake's time is this process's CPU (the fake, "
        "the polls and the probe below).",
        "",
        "| items | upload | create (every line read) | ran | items done | items/s | wall an "
        "item | less the fake's time | sidecar CPU an item | the queue's own | then | output "
        "+ error lines streamed back |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['items']:,} ({r['file_mb']:.1f} MB) | {r['upload_s']:.2f} s | "
            f"{r['create_s']:.2f} s | {r['run_s']:.0f} s | {r['done_in_run']:,} | "
            f"{r['items_per_s']:.0f} | {r['wall_ms_per_item']:.2f} ms | "
            f"{r['overhead_wall_ms_per_item']:.2f} ms | {r['sidecar_cpu_ms_per_item']:.2f} ms | "
            f"{r['queue_cpu_ms_per_item']:+.2f} ms | {r['status']} | {r['output_lines']:,} + "
            f"{r['error_lines']:,} in {r['download_s']:.2f} s |"
        )
    lines += [
        "",
        "The queue's own calls (`BatchQueue`, SQLite, no HTTP), µs each, with one batch of so "
        "many items pending. The runner makes a round of them — its lease, `settle`, `take` "
        "and, when a slot is left, `next_due` — whenever an item ends:",
        "",
        "| items pending | create (s) | take 4 (and put back) | next_due | settle | finish one |",
        "|---|---|---|---|---|---|",
    ]
    for size, c in d["queue_calls"].items():
        lines.append(
            f"| {int(size):,} | {c['create_s']:.2f} | {c['take_4_us']:,.0f} | "
            f"{c['next_due_us']:,.0f} | {c['settle_us']:,.0f} | {c['finish_us']:,.0f} |"
        )
    lines += [
        "",
        "None of the calls grows with the items pending: `take` reads the first due items from "
        "an index in their order, `next_due` one index row per running batch, `settle` the "
        "counts each batch keeps by state (kept in the transactions that change its items), "
        "and `finish` one item. (Before 2026-12-04 all but `finish` read every pending item — "
        "at 100,000 pending, take 132 ms, next_due 30 ms, settle 16 ms a round — and a "
        "100,000-item batch ran at 13 items a second.)",
        "",
        f"The sidecar's resident memory: {d['idle_rss_mb']:.1f} MiB warm and idle, "
        f"{d['before_rss_mb']:.1f} MiB after the ordinary requests, at most "
        f"{d['peak_rss_mb']:.1f} MiB through every upload, run, cancel and download (sampled "
        f"every 0.1 s): +{d['rss_growth_mb']:.1f} MiB over idle. Lines are read from the "
        "uploaded file one item at a time and streamed back out of the table.",
        "",
        f"Interactive requests ({PROBE}) took p50 {alone['p50_ms']:.1f} / p99 "
        f"{alone['p99_ms']:.1f} ms with the sidecar otherwise idle ({alone['requests']} "
        "requests), and as each batch started: "
        + "; ".join(
            f"{r['items']:,} items, p50 {r['probe_beside_batch']['p50_ms']:.1f} / p99 "
            f"{r['probe_beside_batch']['p99_ms']:.1f} ms ({r['probe_beside_batch']['requests']})"
            for r in runs
        )
        + ". The items share the sidecar's one event loop and its CPU with them.",
        "",
    ]
    return lines
