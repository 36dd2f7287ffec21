"""The agent-sized benchmark's bodies are the size it says and what each door reads, and its
report is made of its figures: a peer that is skipped, or does not serve a door, is said so, not
drawn as zero."""

from __future__ import annotations

import json
from typing import Any

import pytest

import lanes
from bench import agent, agentbodies, agentmarks, agentreport, peers
from lanes import load_config
from lanes._http import doors
from lanes._http.validation import job_headers, json_object, parse_job
from lanes.testing import answer, open_fake


@pytest.mark.parametrize("door", list(agent.DOORS))
@pytest.mark.parametrize("kb", [1, 32, 128])
def test_a_body_is_about_its_size_and_a_door_reads_it(door, kb):
    """Each door's body is within a turn of its size in KB (1 KB holds the system prompt and
    three tools, a little more), and lanes reads it as a chat job with the tool calls and
    results of its history."""
    body = agentbodies.agent_body(kb, door)
    raw = json.dumps(body).encode()
    assert kb * 1024 - 2000 <= len(raw) <= max(kb * 1024, 2500) + 2000
    if door == "chat":
        job, _ = parse_job(raw, {}, "bench")
    else:
        api = doors.MESSAGES if door == "messages" else doors.RESPONSES
        job, _ = doors.translated_job(api, json_object(raw), "bench", job_headers({}))
    roles = [m["role"] for m in job.messages]
    assert roles.count("tool") >= (kb > 1) * kb // 8  # 40 tool schemas fill 32 KB already


def figures() -> dict[str, Any]:
    """A run's figures as `agent.run` makes them: two rounds, Portkey not at the Messages door."""
    raw: dict[str, Any] = {}
    for door in agent.DOORS:
        for kind in agent.KINDS:
            for kb in (1, 512):
                for peer, base in (("direct", 0), ("floor", 2), ("lanes", 3), ("portkey", 4)):
                    if peer == "portkey" and door == "messages":
                        continue
                    runs = [
                        {"p50_ms": base + kb / 100, "ttfb_p50_ms": 1.0}
                        | ({"cpu_ms": base * (1 + kb / 64)} if peer != "direct" else {})
                        for _ in range(2)
                    ]
                    raw[f"{door} {kind} c1 {kb}"] = {
                        **raw.get(f"{door} {kind} c1 {kb}", {}),
                        peer: runs,
                    }
    lengths = {f"{door} {kb}": kb * 1024 for door in agent.DOORS for kb in (1, 512)}
    result = agent.figures(raw, lengths, [1, 512])
    result.update(
        date="2026-12-04",
        rounds=2,
        requests=40,
        load_average=[[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]],
        versions={"lanes": "0.1.0"},
        skipped={"litellm": "LiteLLM is not installed"},
        failed={},
        unserved={"portkey messages": "not served"},
        notes={},
        rss={"lanes": {"idle_mb": 60.0, "held_mb": 90.0, "ok": 64}},
        cold={
            "direct": {k: {"ok": 64, "median_s": 5.0, "max_s": 5.1} for k in agent.KINDS},
            "lanes": {k: {"ok": 64, "median_s": 5.5, "max_s": 5.6} for k in agent.KINDS},
        },
        held=64,
        held_kb=512,
    )
    return result


def test_added_latency_at_a_translated_door_is_against_what_was_sent():
    """Where `direct` was timed on lanes' own upstream request — which the floor, translating as
    lanes does, sends too — lanes' and the floor's added p50 are their p50 less that one's, and
    the mark reads both so (each figure against the door's body said beside it)."""
    raw = {
        "messages json c1 128": {
            "direct": [{"p50_ms": 2.0, "ttfb_p50_ms": 2.0}] * 2,
            agent.SENT: [{"p50_ms": 4.0, "ttfb_p50_ms": 4.0}] * 2,
            "floor": [{"p50_ms": 5.0, "ttfb_p50_ms": 5.0, "cpu_ms": 3.0}] * 2,
            "lanes": [{"p50_ms": 7.5, "ttfb_p50_ms": 7.5, "cpu_ms": 3.5}] * 2,
        }
    }
    result = agent.figures(raw, {"messages 128": 128 * 1024}, [1, 128])
    peers_ = result["cells"]["messages json c1 128"]["peers"]
    assert (peers_["lanes"]["added_p50_ms"], peers_["lanes"]["added_sent_p50_ms"]) == (5.5, 3.5)
    assert (peers_["floor"]["added_p50_ms"], peers_["floor"]["added_sent_p50_ms"]) == (3.0, 1.0)
    result.update(us_per_kb={}, cold={}, held=64)
    marks = {what: (said, met) for what, said, met in agentmarks.targets(result)}
    said, met = marks["added p50 at 128 KB c=1, messages json (lanes ≤ floor + 2 ms)"]
    assert said == (
        "lanes 3.50 (5.50 against the door's body), floor 1.00 (3.00 against the door's body) ms"
    )
    assert not met  # 3.5 > 1.0 + 2, though 3.5 ≤ 3.0 + 2 against the door's body


def test_the_report_says_what_was_measured_and_what_was_not(tmp_path):
    """Ratios and growth from the figures; the skipped peer and the unserved door named; the
    marks computed; the chart drawn without the missing peer."""
    result = figures()
    text = "\n".join(agentreport.section(result))
    assert "litellm skipped: LiteLLM is not installed" in text
    assert "portkey messages: not served" in text
    assert "the floor sends a Messages or Responses body on untranslated" in text  # a run before
    translating = "\n".join(agentreport.section({**result, "floor": "translates"}))
    assert "the floor translates with lanes' own pure translations" in translating
    assert "lanes and the floor send the same chat translation" in translating
    assert f"Raw figures: `bench/results/agent-{result['date']}.json`" in text
    named = "\n".join(agentreport.section({**result, "source": "bench/results/agent-x.json"}))
    assert "Raw figures: `bench/results/agent-x.json`" in named  # the file the run wrote
    assert "| 512 KB (524,288 B) | chat | JSON | 18.00 | 27.00 | 36.00 | 1.50× | 0.75× |" in text
    marks = {what: met for what, _, met in agentmarks.targets(result)}
    assert marks["lanes / floor CPU at 128 and 512 KB, chat json (≤ 1.3×)"] is False
    assert (
        marks[
            "64 requests at once to a cold model, sse: median finish within 1.2× of the "
            "upstream's own"
        ]
        is True
    )
    chart = agentreport.chart(result, tmp_path / "agent.svg")
    assert chart is not None and "<polyline" in chart.read_text()
    assert "LiteLLM" not in chart.read_text() and "Portkey" in chart.read_text()


@pytest.mark.free_lane  # the bench's lane is a free one
@pytest.mark.parametrize("door", ["messages", "responses"])
@pytest.mark.parametrize("kind", agent.KINDS)
async def test_direct_is_timed_on_what_lanes_sends_upstream(door, kind, env):
    """At a translated door lanes' added latency is taken against `direct` timed on
    `sent_upstream`: the very request lanes (as bench.agent runs it) sent the upstream for that
    body."""
    body = agentbodies.agent_body(32, door)
    api = doors.MESSAGES if door == "messages" else doors.RESPONSES
    job, _ = doors.translated_job(api, body, "bench", {})
    async with open_fake("bench", models=("fast",)) as fake:
        fake.script("fast", answer())
        bench_lane = peers.ours_config(fake.base_url, models=agent.MODELS)  # what bench.agent runs
        async with lanes.open_dispatcher(load_config(bench_lane, env={}), env=env) as dispatcher:
            if kind == "sse":
                async with dispatcher.open_stream(job) as stream:
                    async for _ in stream:
                        pass
            else:
                await dispatcher.complete(job)
    [sent] = fake.requests()
    assert sent.body == agentbodies.sent_upstream(door, body, kind)
