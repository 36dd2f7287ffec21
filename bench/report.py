"""docs/benchmarks.md (and its PNG charts) from one bench run's JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import agentreport, batchreport, cache, onehost, publish
from bench.sections import (
    audit_section,
    hot_section,
    page_section,
    plan_section,
    whatif_section,
    workers_section,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HISTORY = DOCS / "benchmarks-history.md"  # sections a later run replaced (`bench/publish.py`)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _chart(data: dict[str, Any], name: str) -> str | None:
    try:
        # matplotlib is the optional `bench` extra, absent from the test venv (no chart then):
        # `unused-ignore` keeps these quiet where it is installed (it ships its own types).
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    speed = data["speed"]
    peers = list(speed)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, kind in zip(axes, ("json", "sse"), strict=True):
        values = [speed[p][f"{kind}_c64"]["rps"] for p in peers]
        spread = [
            [speed[p][f"{kind}_c64"]["rps"] - speed[p][f"{kind}_c64"]["rps_min"] for p in peers],
            [speed[p][f"{kind}_c64"]["rps_max"] - speed[p][f"{kind}_c64"]["rps"] for p in peers],
        ]
        ax.bar(
            peers,
            values,
            yerr=spread,
            color=["#999", "#4a7", "#27c", "#59e", "#c63", "#e96"][: len(peers)],
            capsize=4,
        )
        ax.set_title(f"{kind.upper()} throughput at 64 connections (req/s)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = DOCS / f"{name}-throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _shared(r: dict[str, Any] | None) -> list[str]:
    """Several sidecars on one Redis: the cross-host herd, the added latency, the kill switch, the
    store calls."""
    if not r:
        return []
    lines = ["", "## Several sidecars on one Redis", ""]
    if "skipped" in r:
        return lines + [f"Skipped: {r['skipped']}.", ""]
    h = r["herd"]
    lines += [
        (
            "200 clients split evenly across several `lanes serve` processes (hosts, in effect), "
            "the upstream"
        ),
        (
            'answering 429 + Retry-After: 5; sharing one Redis (`state = "redis://…"`) against '
            "each keeping its"
        ),
        "own state.",
        "",
        "| state | sidecars | upstream requests in the 5 s window | in all | client statuses |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {'one Redis' if k.startswith('shared') else 'separate'} | {row['sidecars']} | "
        f"{row['upstream_requests_in_window']} | {row['upstream_requests']} | "
        f"{row['client_statuses']} |"
        for k, row in h.items()
    ]
    lat = r["latency"]
    lines += [
        "",
        (
            "Added latency per job of the Redis store: one sidecar with `state` in a SQLite file, "
            "then in Redis,"
        ),
        (
            f"{lat['reps']} interleaved repetitions of {lat['jobs_per_rep']} jobs each (medians; "
            "Redis minus SQLite within"
        ),
        (
            "each repetition). A free job makes no Redis round trip; a paid job waits for one "
            "reservation (a Lua script"
        ),
        "run from a worker thread).",
        "",
        (
            "| path | concurrency | SQLite p50 / p99 (ms) | Redis p50 / p99 (ms) | added p50 / "
            "p99 (ms) |"
        ),
        "|---|---|---|---|---|",
    ]
    for key in ("free_c1", "free_c8", "paid_c1", "paid_c8"):
        row = lat[key]
        lines.append(
            f"| {key.split('_')[0]} | {key.split('_c')[1]} | {_fmt(row['sqlite']['p50_ms'])} / "
            f"{_fmt(row['sqlite']['p99_ms'])} | {_fmt(row['redis']['p50_ms'])} / "
            f"{_fmt(row['redis']['p99_ms'])} | "
            f"{_fmt(row['added_p50_ms'])} / {_fmt(row['added_p99_ms'])} |"
        )
    if "in_process" in r:
        ip = r["in_process"]
        lines += [
            "",
            "Without HTTP in the way (one dispatcher, jobs one at a time against an "
            "in-process fake, "
            f"{ip['reps']} × {ip['jobs_per_rep']} jobs, median of the per-repetition p50s): free "
            f"{_fmt(ip['free']['sqlite_p50_ms'], 2)} → {_fmt(ip['free']['redis_p50_ms'], 2)} ms "
            f"(added {_fmt(ip['free']['added_p50_ms'], 2)}), paid "
            f"{_fmt(ip['paid']['sqlite_p50_ms'], 2)} → "
            f"{_fmt(ip['paid']['redis_p50_ms'], 2)} ms (added "
            f"{_fmt(ip['paid']['added_p50_ms'], 2)}).",
        ]
    k, c = r["kill_switch"], r["store_calls"]
    lines += [
        "",
        "A kill switch thrown on one sidecar reached the other's `/v1/lanes` in "
        f"{_fmt(k['p50_ms'])} ms "
        f"(median of {k['samples']}, max {_fmt(k['max_ms'])} ms, polled every 2 ms).",
        "",
        "The store calls a job can wait on, one thread, µs per call: "
        f"paid reservation SQLite {_fmt(c['sqlite']['reserve_paid_us'], 0)}, Redis "
        f"{_fmt(c['redis']['reserve_paid_us'], 0)}; "
        f"probe lease SQLite {_fmt(c['sqlite']['probe_lease_us'], 0)} (a row in the host's "
        f"file), Redis {_fmt(c['redis']['probe_lease_us'], 0)}; "
        f"a trio → worker thread → trio hop {_fmt(c['thread_hop_us'], 0)}.",
        "",
    ]
    return lines


def write_report(data: dict[str, Any], json_path: Path) -> Path:
    """Publish the run's sections into docs/benchmarks.md (`bench/publish.py`: what they replace
    goes to docs/benchmarks-history.md) and draw its charts."""
    DOCS.mkdir(exist_ok=True)
    chart = _chart(data, "benchmarks")
    if data.get("agent") and "cells" in data["agent"]:
        agentreport.chart(data["agent"])
    path = DOCS / "benchmarks.md"
    publish.write(publish.sections(render(data, json_path, chart)), path, HISTORY, data["date"])
    return path


def render(data: dict[str, Any], json_path: Path, chart: str | None) -> list[str]:
    """The page's preamble and the sections of what this run measured (`chart`: the throughput
    chart's file, if drawn). A bench the run did not run has no section here, so publishing it
    leaves that bench's section as it is — but for the benches that run on their own (the plan,
    `--workers 2`, the status page, the cache), whose newest result is read."""
    speed = data["speed"]
    m, v = data["machine"], data["versions"]
    lines = [
        "# Benchmarks",
        "",
        f"One run on {data['date']}{' (quick)' if data['quick'] else ''}: {m['cpu']}, "
        f"{m['cores']} cores, "
        f"{m['memory_gib']} GiB, Python {m['python']}. Versions: "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + ".",
        (
            f"Raw numbers: `{json_path.relative_to(ROOT)}`. Regenerate with `make bench` (or "
            "`make bench-quick`)."
        ),
        "",
        (
            "Every peer runs against the same fake upstream on loopback, with the same load "
            "generator (trio + httpx2),"
        ),
        (
            "on the same shared 2-core machine as the load and the upstream — so compare the "
            "**ratios**, not the absolute"
        ),
        (
            "figures. `direct` is the client straight to the upstream; `limit` is a bare "
            "pass-through proxy on our own"
        ),
        "stack (hypercorn trio worker + httpx2, no routing): what this stack could do at best. "
        "`floor` is the",
        (
            "limit plus only what no router can skip (`bench/floor.py`: the request read and "
            "written again as JSON, the answer"
        ),
        "parsed, every stream event too, three headers; at the Messages and Responses doors "
        "both translated with",
        "lanes' own pure translations, since the upstream speaks chat): the gap between `floor` "
        "and `lanes` is lanes'",
        "own work. The floor reads and writes JSON with the standard library's `json`; "
        "`floor-msgspec`, in the",
        "agent-sized section, does it with msgspec, as lanes writes and (beneath its strict "
        "checks) reads it.",
        "",
        "## Added latency (p50 / p99, ms, over direct)",
        "",
        "| peer | JSON c=1 | JSON c=8 | SSE first byte c=1 | SSE first byte c=8 |",
        "|---|---|---|---|---|",
    ]
    for peer, row in speed.items():
        if peer == "direct":
            continue
        cells = [
            f"{_fmt(row[f'added_{k}_p50_ms'])} / {_fmt(row[f'added_{k}_p99_ms'])}"
            for k in ("json_c1", "json_c8", "sse_c1", "sse_c8")
        ]
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    lines += ["", "## Throughput at 64 connections", ""]
    if chart:
        lines += [f"![throughput]({chart})", ""]
    lines += [
        (
            "| peer | JSON req/s (min–max) | JSON p50 / p99 ms | SSE req/s (min–max) | SSE p50 / "
            "p99 ms |"
        ),
        "|---|---|---|---|---|",
    ]
    for peer, row in speed.items():
        j, s = row["json_c64"], row["sse_c64"]
        lines.append(
            f"| {peer} | {_fmt(j['rps'], 0)} ({_fmt(j['rps_min'], 0)}–{_fmt(j['rps_max'], 0)}) | "
            f"{_fmt(j['p50_ms'])} / {_fmt(j['p99_ms'])} | {_fmt(s['rps'], 0)} "
            f"({_fmt(s['rps_min'], 0)}–"
            f"{_fmt(s['rps_max'], 0)}) | {_fmt(s['p50_ms'])} / {_fmt(s['p99_ms'])} |"
        )
    ratios = []
    for mine, other in (
        ("lanes", "limit"),
        ("floor", "limit"),
        ("lanes", "floor"),
        ("lanes", "litellm"),
        ("lanes-w2", "lanes"),
        ("lanes-w2", "litellm-w2"),
    ):
        if other in speed and mine in speed:
            ours = speed[mine]
            ratios.append(
                f"{mine} / {other}: JSON "
                f"{ours['json_c64']['rps'] / speed[other]['json_c64']['rps']:.2f}×, "
                f"SSE {ours['sse_c64']['rps'] / speed[other]['sse_c64']['rps']:.2f}×"
            )
    lines += ["", "Ratios: " + "; ".join(ratios) + "." if ratios else "", ""]
    lines += [
        "## Memory (RSS, MiB)",
        "",
        "| peer | idle | under load (c=64) | many SSE streams held |",
        "|---|---|---|---|",
    ]
    held = data.get("streams_held", {})
    for peer, row in speed.items():
        if peer == "direct":
            continue
        h = held.get(peer, {})
        lines.append(
            f"| {peer} | {_fmt(row['idle_rss_mb'])} | {_fmt(row['load_rss_mb'])} | "
            f"{_fmt(h.get('rss_mb'))} ({h.get('ok', '—')}/{h.get('streams', '—')} streams) |"
        )
    long = data.get("long_stream", {})
    if long:
        words = max(r["chunks"] for r in long.values())
        lines += [
            "",
            f"## One long stream ({words:,} chunks, one word each)",
            "",
            "| peer | chunks/s | × direct |",
            "|---|---|---|",
        ]
        base = long.get("direct", {}).get("chunks_per_s")
        for p, r in long.items():
            rate = r["chunks_per_s"]
            if rate is None:
                lines.append(f"| {p} | failed after {r['chunks']:,} chunks ({r['error']}) | — |")
                continue
            lines.append(f"| {p} | {_fmt(rate, 0)} | {_fmt(rate / base, 2) if base else '—'} |")
    lines += [
        "",
        "## Startup (process start to first answer; ours with every provider dead)",
        "",
        "| peer | seconds |",
        "|---|---|",
    ]
    lines += [f"| {p} | {_fmt(s, 2)} |" for p, s in data["startup"].items()]
    lines += [
        "",
        "## Thundering herd: 200 clients, the upstream answering 429 + Retry-After: 5",
        "",
        "| peer | upstream requests in the 5 s window | in all | client statuses |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {p} | {r['upstream_requests_in_window']} | {r['upstream_requests']} | "
        f"{r['client_statuses']} |"
        for p, r in data["herd"].items()
    ]
    lines += [
        "",
        "## Deadline precision: a hung upstream, concurrent jobs with a 2 s deadline",
        "",
        (
            "Connections are opened before the clock starts. Measured at the client: with many "
            "jobs at once the"
        ),
        (
            "figure includes the load generator's own queueing (one Python process sending them "
            "all on two shared"
        ),
        "cores), so the single-job column is the deadline's own precision.",
        "",
        (
            "| peer | one job alone: p50 (ms) | concurrent jobs | answer time − deadline p50 / "
            "p99 / max (ms) | statuses |"
        ),
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {p} | {_fmt(r.get('alone_overshoot_p50_ms'))} | {r['jobs']} | "
        f"{_fmt(r['overshoot_p50_ms'])} / "
        f"{_fmt(r['overshoot_p99_ms'])} / {_fmt(r['overshoot_max_ms'])} | {r['statuses']} |"
        for p, r in data["deadline"].items()
    ]
    lines += _shared(data.get("shared"))
    lines += onehost.report(data.get("one_host"))
    f = data["free_share"]
    lines += [
        "",
        f"## Free share against an oracle ({f['hours']:g} simulated hours, virtual time)",
        "",
        (
            "Poisson arrivals with bursts over five free providers with known per-minute and "
            "per-day quotas —"
        ),
        (
            "reported in headers, only in 429 bodies, with epoch-ms resets, and one whose limits "
            "are not in our"
        ),
        (
            "config — and a paid fallback. The oracle is the exact maximum flow (jobs → minute → "
            "provider quota →"
        ),
        (
            "daily quota) computed by min-cut over the 2^5 provider cuts: it knows every quota "
            "and every arrival in"
        ),
        "advance, so no router can serve more jobs free; it is an upper bound.",
        "",
        (
            "| jobs | served free | oracle | share of oracle | paid | paid spend | requests to "
            "exhausted providers |"
        ),
        "|---|---|---|---|---|---|---|",
        f"| {f['jobs']} | {f['free']} ({f['free_share']:.1%}) | {f['oracle_free']} "
        f"({f['oracle_free_share']:.1%}) | "
        f"{f['share_of_oracle']:.1%} | {f['paid']} | ${f.get('cost', 0.0):.4f} | "
        f"{f['requests_to_exhausted_providers']} |",
        "",
    ]
    if data["date"] < "2026-12-04":  # the day the fakes began to tell an answered request apart
        lines += [
            "The last column counted nothing before 2026-12-04 (the fakes log every request as "
            "`quota`, answered or refused); it is now the requests to the free fakes less those "
            "served free — 1 in a run of the same day on 2026-12-04.",
            "",
        ]
    lines += agentreport.section(data.get("agent"))
    if "batchday" in data or "batch100k" in data:
        lines += batchreport.sections(data)
    lines += audit_section(data.get("audit_report"))
    lines += whatif_section(data.get("whatif"))
    lines += hot_section(data.get("hot"))
    lines += plan_section(_latest("plan"))
    lines += workers_section(_latest("workers-cpu"))
    lines += page_section(_latest("page"))
    lines += cache.section(data.get("cache") or _latest("cache"))
    return lines


def rewrite_section(section: list[str], when: str, path: Path = DOCS / "benchmarks.md") -> bool:
    """Put `section` in place of `path`'s section of the same name (`publish.key`), leaving the
    others as they are (a measure run on its own); what it replaces goes to the history page.
    False when `section` is empty (nothing to write)."""
    if not section:
        return False
    if not section[0].startswith("## "):
        raise ValueError(f"a section begins with its heading, not {section[0][:40]!r}")
    publish.write([(publish.key(section[0]), section)], path, HISTORY, when)
    return True


def _latest(kind: str) -> dict[str, Any] | None:
    """The newest `bench/results/<kind>-<date>[-<commit>].json`, if any (a day's later run, named
    by `publish.result_path`, after its first)."""
    runs = sorted((ROOT / "bench" / "results").glob(f"{kind}-2*.json"), key=lambda p: p.stem)
    return json.loads(runs[-1].read_text()) if runs else None


if __name__ == "__main__":
    import sys

    source = Path(sys.argv[1]).resolve()
    write_report(json.loads(source.read_text()), source)
