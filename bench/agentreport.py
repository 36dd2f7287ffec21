"""docs/benchmarks.md's section on agent-sized requests, its chart (an SVG written here, no
plotting library needed) and the lines `python -m bench.agent` prints, from one run's figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from bench.agentmarks import (
    DOOR_NAMES,
    SENT_NOTE,
    TRANSLATING_SENT_NOTE,
    cells_at,
    floor_note,
    targets,
)
from lanes._core.config.schema import LaneConfig

#: how long a cold model's probe holds the others when it does not answer (the lanes default)
QUIET_S = attrs.fields(LaneConfig).probe_quiet_s.default

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "docs" / "benchmarks-agent.svg"
NAMES = {
    "floor": "floor",
    "floor-msgspec": "floor (msgspec)",
    "lanes": "lanes",
    "litellm": "LiteLLM",
    "portkey": "Portkey",
}
COLOURS = {
    "floor": "#4a7",
    "floor-msgspec": "#9c3",
    "lanes": "#27c",
    "litellm": "#c63",
    "portkey": "#96c",
}


def _peers(result: dict[str, Any]) -> list[str]:
    seen = {name for row in result["cells"].values() for name in row["peers"]}
    return [name for name in NAMES if name in seen]


def _ms(row: dict[str, Any], name: str, field: str = "cpu_ms") -> str:
    value = row["peers"].get(name, {}).get(field)
    return "—" if value is None else f"{value:.2f}"


def _ratio(row: dict[str, Any], name: str) -> str:
    value = row["lanes_over"].get(name)
    return "—" if value is None else f"{value:.2f}×"


def summary(result: dict[str, Any]) -> list[str]:
    """What `python -m bench.agent` prints: each cell at c=1, then the marks."""
    lines = []
    names = _peers(result)
    for door, kind, kb, row in cells_at(result, 1):
        cpu = ", ".join(f"{NAMES[n]} {_ms(row, n)}" for n in names)
        lines.append(
            f"{door:>9} {kind} {kb:>4} KB: CPU ms {cpu}; lanes/floor {_ratio(row, 'floor')}"
        )
    for what, shown, met in targets(result):
        lines.append(f"{'met' if met else 'NOT met'}: {what}: {shown}")
    load = result["load_average"]
    lines.append(
        f"load average (1 min) {min(x[0] for x in load):.1f}-{max(x[0] for x in load):.1f}"
    )
    return lines


def _table(result: dict[str, Any], conc: int) -> list[str]:
    names = _peers(result)
    others = [n for n in names if n != "lanes"]
    head = " | ".join(NAMES[n] for n in names)
    ratios = " | ".join(f"lanes / {NAMES[n]}" for n in others)
    lines = [
        f"| body | door | answer | {head} | {ratios} |",
        "|---|---|---|" + "---|" * (len(names) + len(others)),
    ]
    for door, kind, kb, row in cells_at(result, conc):
        values = " | ".join(_ms(row, n) for n in names)
        shares = " | ".join(_ratio(row, n) for n in others)
        lines.append(
            f"| {kb} KB ({row['bytes']:,} B) | {DOOR_NAMES[door]} | {kind.upper()} | {values} | "
            f"{shares} |"
        )
    return lines


def _growth(result: dict[str, Any]) -> list[str]:
    names = _peers(result)
    lines = [
        f"| door | answer | {' | '.join(NAMES[n] for n in names)} | lanes / floor |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for key, g in result["us_per_kb"].items():
        door, kind, conc = key.split()
        if conc != "c1":
            continue
        values = " | ".join(f"{g[n]:.1f}" if n in g else "—" for n in names)
        ratio = f"{g['lanes'] / g['floor']:.2f}×" if g.get("floor", 0) > 0 and "lanes" in g else "—"
        lines.append(f"| {DOOR_NAMES[door]} | {kind.upper()} | {values} | {ratio} |")
    return lines


def _added_cell(fig: dict[str, Any]) -> str:
    """A peer's added p50: lanes' at a translated door against what it sent, the figure against
    the door's body beside it (`SENT_NOTE`)."""
    if "added_sent_p50_ms" in fig:
        return f"+{fig['added_sent_p50_ms']:.2f} (+{fig['added_p50_ms']:.2f})"
    return "—" if (v := fig.get("added_p50_ms")) is None else f"+{v:.2f}"


def _added(result: dict[str, Any]) -> list[str]:
    names = _peers(result)
    lines = [
        f"| body | door | answer | direct p50 | {' | '.join(NAMES[n] for n in names)} |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for door, kind, kb, row in cells_at(result, 1):
        if kb not in (128, 512):
            continue
        direct = _ms(row, "direct", "p50_ms")
        values = " | ".join(_added_cell(row["peers"].get(n, {})) for n in names)
        lines.append(f"| {kb} KB | {DOOR_NAMES[door]} | {kind.upper()} | {direct} | {values} |")
    return lines


def section(result: dict[str, Any] | None) -> list[str]:
    """docs/benchmarks.md's section from a run's figures (None, or an older run's shape: none)."""
    if not result or "cells" not in result:
        return []
    load = result["load_average"]
    versions = result.get("versions", {})
    lines = [
        "## Agent-sized requests: lanes beside the floor, LiteLLM and Portkey",
        "",
        f"`python -m bench.agent` on {result['date']}"
        + (f" (commit {result['commit']})" if result.get("commit") else "")
        + f": a coding agent's turn (system prompt, {_tools_note()}, tool calls and their "
        "results) of 1 to 512 KB through each door, answered whole (JSON) and streamed (SSE), "
        f"rounds: {result['rounds']}, each peer in turn within a round (each going first in turn), "
        "medians over the rounds. CPU is each process's user + system time (and its children's) "
        f"over the requests of a cell ({result['requests']} a cell, twice that up to 32 KB), "
        f"{_cpu_source(result)}. Load average (1 min) "
        f"{min(x[0] for x in load):.1f}–{max(x[0] for x in load):.1f} during the run, on 2 cores "
        "shared with other work: compare the ratios, which fall on every peer alike. Versions: "
        + ", ".join(f"{NAMES.get(k, k)} {v}" for k, v in versions.items())
        + f". Raw figures: `{_source(result)}`.",
        "",
        "![CPU per request by body size, c=1](benchmarks-agent.svg)",
        "",
        "CPU ms a request, one request at a time (c=1):",
        "",
        *_table(result, 1),
        "",
        "Eight at once (c=8):",
        "",
        *_table(result, 8),
        "",
        "Growth per KB of request (c=1; the slope from the smallest to the largest body), µs:",
        "",
        *_growth(result),
        "",
        "Added latency (p50 over the upstream's own, ms; c=1; at the Messages and Responses "
        "doors lanes' is against the upstream's time on the chat request lanes sends it, the "
        "figure against the door's body sent direct in brackets):",
        "",
        *_added(result),
        "",
    ]
    if result.get("rss"):
        lines += [
            f"Resident memory (MiB) idle and with {result['held']} streamed "
            f"{result.get('held_kb', 512)} KB chat requests in flight (the fake upstream's `slow` "
            "model: ten chunks 0.6 s apart):",
            "",
            "| peer | idle | in flight | answered |",
            "|---|---|---|---|",
        ]
        for name, r in result["rss"].items():
            lines.append(
                f"| {NAMES.get(name, name)} | {r['idle_mb']:.1f} | {r['held_mb']:.1f} | "
                f"{r['ok']}/{result['held']} |"
            )
        lines.append("")
    lines += _cold(result)
    lines += _before(result)
    lines += [
        "Issue 45's marks in this run. At the Messages and Responses doors each is given twice: "
        "beside the floor's cell of the same door, and beside the floor's chat cell — "
        + floor_note(result)
        + ". "
        + (TRANSLATING_SENT_NOTE if result.get("floor") == "translates" else SENT_NOTE)
        + ".",
        "",
        "| mark | measured | met |",
        "|---|---|---|",
    ]
    lines += [f"| {w} | {s} | {'yes' if m else 'no'} |" for w, s, m in targets(result)]
    lines.append("")
    notes = [f"{k}: {v}" for k, v in result.get("unserved", {}).items()]
    notes += [f"{k}: {v}" for k, v in result.get("notes", {}).items()]
    notes += [f"{k} skipped: {v}" for k, v in result.get("skipped", {}).items()]
    notes += [f"{k} failed: {v}" for k, v in result.get("failed", {}).items()]
    if notes:
        lines += ["Notes: " + "; ".join(notes) + ".", ""]
    return lines


def _cold(result: dict[str, Any]) -> list[str]:
    """The requests sent at once to a model the peer had not heard from."""
    cold = result.get("cold") or {}
    if not cold:
        return []
    lines = [
        f"{result['held']} requests at once to a model each peer has not heard from yet (a fresh "
        "model of the fake upstream: one answering after 5 s, one streaming for 5 s), median and "
        "slowest finish in seconds, and the median over the upstream's own (direct):",
        "",
        "| peer | JSON: median, slowest | SSE: median, slowest | median / direct's, JSON, SSE |",
        "|---|---|---|---|",
    ]
    direct = cold.get("direct", {})
    for name, row in cold.items():
        cells = []
        for kind in ("json", "sse"):
            r = row.get(kind, {})
            cells.append(
                "—" if r.get("median_s") is None else f"{r['median_s']:.2f}, {r['max_s']:.2f}"
            )
        over = ", ".join(
            f"{row[k]['median_s'] / direct[k]['median_s']:.2f}×"
            if row.get(k, {}).get("median_s") and direct.get(k, {}).get("median_s")
            else "—"
            for k in ("json", "sse")
        )
        lines.append(f"| {NAMES.get(name, name)} | {cells[0]} | {cells[1]} | {over} |")
    return [
        *lines,
        "",
        "lanes sends the first request to a model it has not heard from alone, as a probe, and the "
        "others when it answers (its whole answer, or a stream's first chunk) or once it has been "
        f"sent and the lane's `probe_quiet_s` ({QUIET_S:g} s by default) passed with no refusal: "
        "an upstream answering whole sends nothing before its answer, and a refusal comes before "
        "the work.",
        "",
    ]


def _before(result: dict[str, Any]) -> list[str]:
    """lanes / floor beside a run of the same bench before issue 45's changes, when one of the same
    day is kept (`bench/results/agent-<date>-before.json`)."""
    path = ROOT / "bench" / "results" / f"agent-{result['date']}-before.json"
    if not path.exists():
        return []
    before = json.loads(path.read_text())
    lines = [
        f"The same bench before issue 45's changes (`{path.relative_to(ROOT)}`, commit "
        f"{before.get('commit') or '659f6d6'}, load average "
        f"{min(x[0] for x in before['load_average']):.1f}–"
        f"{max(x[0] for x in before['load_average']):.1f}): lanes / floor CPU a request, c=1, "
        "then and now"
        + (
            " (at the Messages and Responses doors the floor then sent the body on untranslated; "
            "now it translates: there the two ratios stand beside different floors)"
            if result.get("floor") == "translates"
            else ""
        )
        + ":",
        "",
        "| door | answer | 128 KB | 512 KB | growth a KB |",
        "|---|---|---|---|---|",
    ]
    for door in DOOR_NAMES:
        for kind in ("json", "sse"):
            cells = []
            for kb in (128, 512):
                key = f"{door} {kind} c1 {kb}"
                then = before["cells"].get(key, {}).get("lanes_over", {}).get("floor")
                now = result["cells"].get(key, {}).get("lanes_over", {}).get("floor")
                cells.append(f"{then:.2f}× → {now:.2f}×" if then and now else "—")
            g0, g1 = (r["us_per_kb"].get(f"{door} {kind} c1", {}) for r in (before, result))
            growth = (
                f"{g0['lanes'] / g0['floor']:.2f}× → {g1['lanes'] / g1['floor']:.2f}×"
                if g0.get("floor", 0) > 0 and g1.get("floor", 0) > 0
                else "—"
            )
            lines.append(
                f"| {DOOR_NAMES[door]} | {kind.upper()} | {cells[0]} | {cells[1]} | {growth} |"
            )
    return [*lines, ""]


def _source(result: dict[str, Any]) -> str:
    """Where the run's figures are: the file `bench.agent` wrote (said in it since 2026-12-04's
    full run at 929e52c), else the day's default name."""
    return str(result.get("source") or f"bench/results/agent-{result['date']}.json")


def _cpu_source(result: dict[str, Any]) -> str:
    """How the run read CPU: each process's clock (`peers.process_cpu_s`, since 2026-12-04's
    fifth run), or /proc's ticks of 10 ms before it."""
    if result.get("cpu_clock") == "process":
        return "read from each process's CPU clock (nanoseconds)"
    return "read from /proc in ticks of 10 ms"


def _tools_note() -> str:
    return "up to 40 tool schemas"


def chart(result: dict[str, Any], path: Path = CHART) -> Path | None:
    """CPU ms per request against body KB, one panel per door and answer (c=1), as an SVG."""
    measured = {(d, k) for d, k, _, _ in cells_at(result, 1)}
    doors = [door for door in DOOR_NAMES if any(d == door for d, _ in measured)]
    kinds = [kind for kind in ("json", "sse") if any(k == kind for _, k in measured)]
    if not measured:
        return None
    names = _peers(result)
    width, height, cols, rows = 300, 210, len(doors), len(kinds)
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * width}" '
        f'height="{rows * height + 30}" font-family="sans-serif" font-size="11">',
        f'<rect width="{cols * width}" height="{rows * height + 30}" fill="white"/>',
    ]
    for i, name in enumerate(names):
        x = 10 + i * 110
        svg.append(f'<rect x="{x}" y="8" width="14" height="4" fill="{COLOURS[name]}"/>')
        svg.append(f'<text x="{x + 18}" y="14">{NAMES[name]}</text>')
    for row, kind in enumerate(kinds):
        for col, door in enumerate(doors):
            if (door, kind) in measured:
                svg += _panel(result, door, kind, names, col * width, 30 + row * height)
    svg.append("</svg>")
    path.write_text("\n".join(svg) + "\n")
    return path


def _panel(
    result: dict[str, Any], door: str, kind: str, names: list[str], left: int, top: int
) -> list[str]:
    shown = [(kb, row) for d, k, kb, row in cells_at(result, 1) if d == door and k == kind]
    most = max(
        (f["cpu_ms"] for _, row in shown for f in row["peers"].values() if "cpu_ms" in f),
        default=1.0,
    )
    step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000) if most / s <= 6)
    top_ms = step * (int(most / step) + 1)
    x0, y0, w, h = left + 40, top + 20, 240, 150
    largest = max(kb for kb, _ in shown)

    def at(kb: float, ms: float) -> tuple[float, float]:
        return x0 + w * kb / largest, y0 + h - h * ms / top_ms

    out = [
        f'<text x="{x0}" y="{top + 12}" font-weight="bold">{DOOR_NAMES[door]}, {kind.upper()}: '
        "CPU ms a request</text>",
        f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#888"/>',
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#888"/>',
    ]
    for ms in range(0, top_ms + 1, step):
        _, y = at(0, ms)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{ms}</text>')
    for kb, _ in shown:
        x, _ = at(kb, 0)
        out.append(f'<text x="{x:.1f}" y="{y0 + h + 14}" text-anchor="middle">{kb}</text>')
    out.append(f'<text x="{x0 + w}" y="{y0 + h + 26}" text-anchor="end">KB</text>')
    for name in names:
        points = [
            at(kb, row["peers"][name]["cpu_ms"])
            for kb, row in shown
            if "cpu_ms" in row["peers"].get(name, {})
        ]
        if not points:
            continue
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        colour = COLOURS[name]
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in points]
    return out
