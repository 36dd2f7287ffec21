"""Issue 45's marks, as one `python -m bench.agent` run measured them: lanes beside the floor (at
each door, and at a translated door beside the floor's chat cell too), LiteLLM and a cold model's
upstream time — and how the report says what the floor did there (`agentreport` prints them)."""

from __future__ import annotations

from typing import Any

DOOR_NAMES = {"chat": "chat", "messages": "Messages", "responses": "Responses"}


def cells_at(result: dict[str, Any], conc: int) -> list[tuple[str, str, int, dict[str, Any]]]:
    """(door, kind, KB, row) at concurrency `conc`, by door, kind and size."""
    out = []
    for key, row in result["cells"].items():
        door, kind, c, kb = key.split()
        if c == f"c{conc}":
            out.append((door, kind, int(kb), row))
    order = list(DOOR_NAMES)
    return sorted(out, key=lambda t: (order.index(t[0]), t[1], t[2]))


def targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 45's marks, as measured in this run: (what, figures, met)."""
    cells, out = result["cells"], list[tuple[str, str, bool]]()
    for door in DOOR_NAMES:
        for kind in ("json", "sse"):
            ratios = [
                cells[k]["lanes_over"].get("floor")
                for kb in (128, 512)
                if (k := f"{door} {kind} c1 {kb}") in cells
            ]
            if ratios and None not in ratios:
                shown = " and ".join(f"{r:.2f}×" for r in ratios)
                out.append(
                    (
                        f"lanes / floor CPU at 128 and 512 KB, {door} {kind} (≤ 1.3×)",
                        shown,
                        all(r <= 1.3 for r in ratios),
                    )
                )
            g = result["us_per_kb"].get(f"{door} {kind} c1", {})
            if g.get("floor", 0) > 0 and "lanes" in g:
                r = g["lanes"] / g["floor"]
                out.append(
                    (
                        f"growth per KB, lanes / floor, {door} {kind} (≤ 1.3×)",
                        f"{g['lanes']:.1f} / {g['floor']:.1f} µs = {r:.2f}×",
                        r <= 1.3,
                    )
                )
            row = cells.get(f"{door} {kind} c1 128", {}).get("peers", {})
            added = added_p50(row.get("lanes", {}))
            floor_added = added_p50(row.get("floor", {}))  # a translating floor's as lanes'
            if added is not None and floor_added is not None:
                (lanes, said), (floor, floor_said) = added, floor_added
                out.append(
                    (
                        f"added p50 at 128 KB c=1, {door} {kind} (lanes ≤ floor + 2 ms)",
                        f"lanes {said}, floor {floor_said} ms",
                        lanes <= floor + 2,
                    )
                )
        over = [
            row["lanes_over"].get("litellm")
            for d, k, _, row in cells_at(result, 1)
            if d == door and k == "json"
        ]
        if over and None not in over:
            out.append(
                (
                    f"lanes / LiteLLM CPU, {door} JSON, every size (< 1×)",
                    ", ".join(f"{r:.2f}×" for r in over),
                    all(r < 1 for r in over),
                )
            )
    out += _chat_floor_targets(result)
    cold = result.get("cold") or {}
    for kind in ("json", "sse"):
        lanes, direct = (cold.get(n, {}).get(kind, {}).get("median_s") for n in ("lanes", "direct"))
        if lanes and direct:
            out.append(
                (
                    f"{result['held']} requests at once to a cold model, {kind}: median "
                    "finish within 1.2× of the upstream's own",
                    f"{lanes:.2f} s / {direct:.2f} s = {lanes / direct:.2f}×",
                    lanes / direct <= 1.2,
                )
            )
    return out


#: what the floor does at a translated door since it translates (`bench/floor.py`): the floor's
#: chat cell is then the conversation with no translation at all
TRANSLATING_FLOOR_NOTE = (
    "the floor translates with lanes' own pure translations and does nothing else lanes does, so "
    "beside it lanes' routing is what is measured. The floor's chat cell is the same conversation "
    "sent and answered in chat's shape, with no translation at all: beside it, lanes pays for "
    "translating too"
)


def floor_note(result: dict[str, Any]) -> str:
    """How the floor met the translated doors in this run."""
    return TRANSLATING_FLOOR_NOTE if result.get("floor") == "translates" else CHAT_FLOOR_NOTE


#: what the floor did at a translated door before it translated: it sent the body on, so the fake
#: upstream finds no chat tools in it and answers a short text (lanes, which translates, gets the
#: tool call every chat request gets): the floor's own chat cell is the same conversation with the
#: same upstream answer, relayed by a proxy that parses, writes again and forwards
CHAT_FLOOR_NOTE = (
    "the floor sends a Messages or Responses body on untranslated, so the fake upstream finds no "
    "chat tools in it and answers a short text, while lanes, which translates, gets the tool call "
    "every chat request gets and translates it back: beside the floor's cell of the same door, "
    "lanes relays a larger answer. The floor's chat cell is the same conversation with the same "
    "upstream answer, parsed, written again and forwarded"
)


#: how lanes' added latency is taken at a translated door (`bench.agentbodies.sent_upstream`)
SENT_NOTE = (
    "A peer's added latency is its p50 less the upstream's own p50 on the request that peer sends "
    "it, round by round: at a translated door lanes sends its chat translation (answered with a "
    "tool call), the floor and LiteLLM the body as it came (answered with text), so lanes' is "
    "taken against `direct` timed on lanes' translation; the figure against the door's body sent "
    "direct is given beside it"
)


#: the same, when the floor translates: it sends what lanes sends
TRANSLATING_SENT_NOTE = (
    "A peer's added latency is its p50 less the upstream's own p50 on the request that peer sends "
    "it, round by round: at a translated door lanes and the floor send the same chat translation "
    "(answered with a tool call), so theirs is taken against `direct` timed on it; the figure "
    "against the door's body sent direct is given beside it"
)


def added_p50(fig: dict[str, Any]) -> tuple[float, str] | None:
    """A peer's added p50 (ms) for a mark — lanes', or a translating floor's — and how it is
    said: against the upstream's time on what lanes sent it where that was measured (`SENT_NOTE`),
    else against `direct`."""
    if "added_sent_p50_ms" in fig:
        sent = fig["added_sent_p50_ms"]
        return sent, f"{sent:.2f} ({fig['added_p50_ms']:.2f} against the door's body)"
    if "added_p50_ms" in fig:
        return fig["added_p50_ms"], f"{fig['added_p50_ms']:.2f}"
    return None


def _cpu(cells: dict[str, Any], key: str, name: str) -> float | None:
    value: float | None = cells.get(key, {}).get("peers", {}).get(name, {}).get("cpu_ms")
    return value


def _chat_floor_targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The marks for the translated doors against the floor's chat cells (`CHAT_FLOOR_NOTE`)."""
    cells, out = result["cells"], list[tuple[str, str, bool]]()
    for door in ("messages", "responses"):
        for kind in ("json", "sse"):
            pairs = [
                (
                    _cpu(cells, f"{door} {kind} c1 {kb}", "lanes"),
                    _cpu(cells, f"chat {kind} c1 {kb}", "floor"),
                )
                for kb in (128, 512)
            ]
            if all(a and b for a, b in pairs):
                ratios = [a / b for a, b in pairs if a and b]
                out.append(
                    (
                        f"lanes on {door} / floor on chat, CPU at 128 and 512 KB, {kind} (≤ 1.3×)",
                        " and ".join(f"{r:.2f}×" for r in ratios),
                        all(r <= 1.3 for r in ratios),
                    )
                )
            lanes = result["us_per_kb"].get(f"{door} {kind} c1", {}).get("lanes")
            floor = result["us_per_kb"].get(f"chat {kind} c1", {}).get("floor")
            if lanes is not None and floor:
                out.append(
                    (
                        f"growth per KB, lanes on {door} / floor on chat, {kind} (≤ 1.3×)",
                        f"{lanes:.1f} / {floor:.1f} µs = {lanes / floor:.2f}×",
                        lanes / floor <= 1.3,
                    )
                )
            mine = cells.get(f"{door} {kind} c1 128", {}).get("peers", {}).get("lanes", {})
            base = cells.get(f"chat {kind} c1 128", {}).get("peers", {}).get("floor", {})
            added = added_p50(mine)
            if added is not None and "added_p50_ms" in base:
                (a, said), b = added, base["added_p50_ms"]
                out.append(
                    (
                        f"added p50 at 128 KB c=1, lanes on {door} / floor on chat, {kind} "
                        "(lanes ≤ floor + 2 ms)",
                        f"lanes {said}, floor {b:.2f} ms",
                        a <= b + 2,
                    )
                )
    return out
