"""The sections of docs/benchmarks.md for the benches that also run on their own — the hot path
(`bench.hot --floor`), `--workers 2`, the status page, the plan, `lanes whatif` and `lanes report`
over large inputs — each made of its run's figures (`bench/report.py` puts them on the page)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import guard

ROOT = Path(__file__).resolve().parent.parent


def audit_section(a: dict[str, Any] | None) -> list[str]:
    if not a:
        return []
    return [
        "## `lanes report` over a large audit",
        "",
        f"{a['jobs']:,} jobs and {a['attempts']:,} attempts over a week, written the way the "
        "sidecar writes them (rows and hourly roll-ups), then the report timed (median of 3):",
        "",
        "| jobs | attempts | write (all rows) | report by cohort | report by model |",
        "|---|---|---|---|---|",
        f"| {a['jobs']:,} | {a['attempts']:,} | {a['fill_s']:.0f} s | "
        f"{a['report_by_cohort_s'] * 1000:.0f} ms | {a['report_by_model_s'] * 1000:.0f} ms |",
        "",
    ]


def workers_section(w: dict[str, Any] | None) -> list[str]:
    """`--workers 2` against one worker, with where the machine's CPU went (bench.workers_cpu)."""
    if not w or "json_per_sidecar_cpu_w2_over_w1" not in w:
        return []
    lines = [
        "## `--workers 2` on this machine",
        "",
        f"`python -m bench.workers_cpu` on {w['date']}, at 64 connections: CPU seconds per wall "
        f"second of the sidecar's processes, the fake upstream and the load generator "
        f"({w['cores']} cores in all).",
        "",
        "| | req/s | sidecar | upstream | load generator | all | req/s per sidecar CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in ("json", "sse"):
        for workers in (1, 2):
            row = w[f"{kind}_w{workers}"]
            cpu = row["cpu_per_wall_s"]
            lines.append(
                f"| {kind.upper()}, {workers} worker{'s' if workers > 1 else ''} | "
                f"{row['rps']:.0f} | {cpu['sidecar']:.2f} | {cpu['upstream']:.2f} | "
                f"{cpu['load_generator']:.2f} | {sum(cpu.values()):.2f} | "
                f"{row['rps'] / cpu['sidecar']:.0f} |"
            )
    lines += [
        "",
        f"Two workers against one: JSON {w['json_w2_over_w1']:.2f}×, SSE "
        f"{w['sse_w2_over_w1']:.2f}×; per CPU second the sidecar used, JSON "
        f"{w['json_per_sidecar_cpu_w2_over_w1']:.2f}×, SSE "
        f"{w['sse_per_sidecar_cpu_w2_over_w1']:.2f}×. With two workers the machine is full: the "
        "sidecar gets what the upstream and the load generator leave of its two cores, so the "
        "ratio here measures the cores left, not the sidecar's scaling.",
        "",
    ]
    return lines


def page_section(p: dict[str, Any] | None) -> list[str]:
    """The status page on 5,000 models, in Chromium (`python -m bench.page`)."""
    if not p:
        return []
    lines = [
        f"## The status page on {p['models']:,} models",
        "",
        f"`python -m bench.page` on {p['date']}: headless Chromium opens the page on a lane of "
        f"{p['models']:,} discovered models, all in `/v1/lanes` (`max_models` and `[metrics] "
        "models_per_lane` raised to match), and watches about 12 s of refreshes, a held "
        '"Switch off" press and a turned page. First paint: the lanes table\'s first row on '
        "screen, from navigation; the sidecar's share is its time to start answering the first "
        "`/v1/lanes`. Long tasks: the main thread's tasks over 50 ms (`PerformanceObserver("
        "'longtask')`). Slowest key: of 26 typed 200 ms apart through the refreshes, from the "
        "press to its frame on screen (the Event Timing API; under 16 ms is not recorded).",
        "",
        "| run | /v1/lanes | first paint | sidecar's share | long tasks | longest | slowest key |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(p["runs"], 1):
        lines.append(
            f"| {i} | {r['lanes_bytes'] / 1e6:.2f} MB | {r['first_paint_ms']} ms | "
            f"{r['sidecar_ms']} ms | {r['long_tasks']} | {r['longest_ms']} ms | "
            f"{r['slowest_key_ms']} ms |"
        )
    return [
        *lines,
        "",
        "Before the page drew a lane's models a page at a time and refreshed one view at a time "
        "(issue 42), the same catalog took 13 s to render and stalled the main thread 12.8 s "
        "(p95), as the issue measured it.",
        "",
    ]


def plan_section(p: dict[str, Any] | None) -> list[str]:
    """The dispatcher's own CPU per job, without HTTP (`python -m bench.plan`)."""
    if not p:
        return []
    lines = [
        "## The dispatcher alone, per job",
        "",
        f"`python -m bench.plan` on {p['date']}: one dispatcher over an in-process upstream "
        f"(httpx2's `MockTransport`), {p['jobs']:,} jobs one at a time, the best of "
        f"{len(next(iter(p['cases'].values()))['runs'])} runs: CPU per job on the reply's path, "
        "and what the state sync adds later (the journal's fold and the audit write).",
        "",
        "| asked | free models | µs a job | + later |",
        "|---|---|---|---|",
    ]
    for name, c in p["cases"].items():
        asked = "an alias of two" if name == "alias" else "`auto`"
        lines.append(
            f"| {asked} | {c['models']} | {c['us_per_job']:.0f} | "
            f"{c['fold_and_write_us_per_job']:.0f} |"
        )
    lines.append("")
    return lines


#: The hot path's figures: name, measure, figure, how lanes must stand to the floor (issue 32).
HOT = (
    ("throughput, JSON c=64", "json_c64", "rps", "≥ 0.90×"),
    ("throughput, SSE c=64", "sse_c64", "rps", "≥ 0.90×"),
    ("CPU per request, JSON c=64", "json_c64", "cpu_ms_per_request", "≤ 1.15×"),
    ("CPU per request, SSE c=64", "sse_c64", "cpu_ms_per_request", "≤ 1.15×"),
    ("SSE first byte p50, c=8", "sse_c8", "ttfb_p50_ms", "≤ 1.3×"),
    ("JSON p50, c=8", "json_c8", "p50_ms", ""),
)


def hot_section(h: dict[str, Any] | None) -> list[str]:
    """lanes beside the floor and the limit, round by round (`python -m bench.hot --floor`)."""
    if not h or not h.get("rounds") or "floor" not in h["rounds"][0]:
        return []
    rounds = h["rounds"]
    head = " | ".join(f"round {i + 1}: lanes / floor (lanes / limit)" for i in range(len(rounds)))
    lines = [
        "## The hot path: lanes beside the floor",
        "",
        f"`python -m bench.hot --floor --rounds {len(rounds)}` on {h['date']}: the limit, lanes "
        "and the floor interleaved in short turns (each going first in turn), so a neighbour's "
        "load falls on all three alike; CPU per request is the process's user + system time "
        "over the answers it gave. Raw numbers: `"
        + (h.get("source") or f"bench/results/hot-{h['date']}.json")
        + "`.",
        "",
        f"| figure | lanes, floor, limit (round 1) | {head} | target (lanes / floor) |",
        "|---|---|" + "---|" * len(rounds) + "---|",
    ]
    for name, measure, figure, target in HOT:
        first = rounds[0]
        values = ", ".join(f"{first[p][measure][figure]:,.2f}" for p in ("lanes", "floor", "limit"))
        cells = " | ".join(
            f"{r['lanes'][measure][figure] / r['floor'][measure][figure]:.2f}× "
            f"({r['lanes'][measure][figure] / r['limit'][measure][figure]:.2f}×)"
            for r in rounds
        )
        lines.append(f"| {name} | {values} | {cells} | {target} |")
    now, published = guard.guard(h), guard.published_hot(before=h["date"])
    if now:
        then = guard.guard(published)
        lines += [
            "",
            f"The guard (issue 45: the tiny-request target retired, lanes / floor throughput at "
            f"c=64 never below {guard.GUARD_FLOOR}×), the rounds' mean: "
            + ", ".join(
                f"{name} {value:.2f}×"
                + (
                    f" ({published['date']}: {then[name]:.2f}×)"
                    if published and name in then
                    else ""
                )
                for name, value in now.items()
            )
            + ".",
        ]
    lines += [
        "",
        "What lanes adds is its own code. In the profiles of 2026-12-02 its requests cost the "
        "same hypercorn and httpx2 work as the floor's (0.58 against 0.56 ms and 0.45 against "
        "0.45 ms of CPU per JSON request), "
        "and the rest — parsing and checking the job, the plan, the gate and breakers, the quota "
        "counts and header parsing, the money path's quote and hold, the journal — is spread "
        "over some sixty functions, none above about 2 % of the samples on its own:",
        "",
    ]
    for kind in ("json", "sse"):  # that day's profiles, else those the paragraph names
        for day in (h["date"], "2026-12-02"):
            profile = ROOT / "bench" / "results" / f"profile-{day}-{kind}.txt"
            if profile.exists():
                lines += _layers(profile)
                break
    memory = ROOT / "bench" / "results" / f"memory-{h['date']}.json"
    if memory.exists():
        rss = json.loads(memory.read_text())
        lines += [
            "RSS (MiB, `python -m bench.hot --memory`): "
            + "; ".join(
                f"{name} idle {r['idle_rss_mb']:.1f}, warm {r['warm_rss_mb']:.1f}, "
                f"{r['ok']}/{r['streams']} streams held {r['rss_mb']:.1f}"
                for name, r in rss.items()
            )
            + ".",
            "",
        ]
    return lines


def _layers(profile: Path) -> list[str]:
    """A py-spy summary's first line and its share of samples by layer, as one paragraph."""
    text = profile.read_text().splitlines()
    block = text[text.index("by layer (innermost named layer on the stack):") + 1 :]
    layers = [
        " ".join(reversed([part.strip() for part in line.split("%", 1)])) + " %"
        for line in block[: next(i for i, v in enumerate(block) if not v)]
    ]
    return [
        f"Profile (`{profile.relative_to(ROOT)}`): {text[0]}; by the innermost named layer on "
        f"the stack: {', '.join(layers)}.",
        "",
    ]


def whatif_section(w: dict[str, Any] | None) -> list[str]:
    if not w:
        return []
    return [
        "## `lanes whatif` over a busy day",
        "",
        f"A synthetic audit of one UTC day ({w['jobs']:,} jobs: Poisson arrivals with ten bursts, "
        "a fifth streamed, a twentieth embeddings) replayed through the real dispatcher on a "
        "virtual clock, in one process (one core), against in-process providers: three free "
        "lanes with per-minute and per-day quotas, a paid lane under a $2 ceiling "
        "(`python -m bench.whatif`):",
        "",
        "| jobs | replay | per job | upstream requests | free share | oracle's bound | paid "
        "jobs, spend | failed | oracle |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {w['jobs']:,} | {w['replay_wall_s']:.1f} s | {w['ms_per_job']:.2f} ms | "
        f"{w['upstream_requests']:,} | {w['free_share']:.1%} | {w['oracle_share']:.1%} | "
        f"{w['paid_jobs']:,}, ${w['paid_usd']:.2f} | {sum(w['failed'].values()):,} | "
        f"{w['oracle_wall_s']:.1f} s |",
        "",
    ]
