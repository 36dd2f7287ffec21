"""`/metrics` as Prometheus reads it: parsed with the reference client's own parser, every family
typed and documented, counters that add up, label values escaped."""

from __future__ import annotations

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "hi"}]
# a model id a provider could list: a quote and backslashes (a newline is refused where ids enter)
WEIRD = 'we"ird\\model\\x'

FAMILIES = {
    "lanes_requests": "counter",
    "lanes_attempts": "counter",
    "lanes_tokens": "counter",
    "lanes_cost_usd": "counter",
    "lanes_job_duration_seconds": "histogram",
    "lanes_attempt_duration_seconds": "histogram",
    "lanes_explored": "counter",
    "lanes_explored_served": "counter",
    "lanes_breaker_state": "gauge",
    "lanes_lane_off": "gauge",
    "lanes_model_breaker_state": "gauge",
    "lanes_backoff_seconds": "gauge",
    "lanes_quota_remaining_requests": "gauge",
    "lanes_model_quarantined": "gauge",
    "lanes_paid_spend_usd": "gauge",
    "lanes_paid_ceiling_usd": "gauge",
    "lanes_free_lane_on": "gauge",
    "lanes_approvals_pending": "gauge",
    "lanes_state_store_up": "gauge",
    "lanes_batches": "gauge",
    "lanes_batch_items": "gauge",
    "lanes_waiting_jobs": "gauge",
}


async def scrape_after_traffic():
    async with open_sidecar(
        ("local", "local", ["local-model"]),
        ("paid", "paid", ["paid-model"]),
        ("odd", "local", [WEIRD]),
    ) as (url, fakes):
        base = url[:-3]
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            await http.post(f"{url}/lanes/odd/off", json={})  # listed, never serving
            local = await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES},
                headers={"x-lanes-cohort": "nightly"},
            )
            await http.post(f"{url}/lanes/local/off", json={})
            paid = await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES},
                headers={"x-lanes-cohort": "nightly"},
            )
            for i in range(30):  # more cohorts than the label set holds
                await http.post(
                    f"{url}/chat/completions",
                    json={"messages": MESSAGES},
                    headers={"x-lanes-cohort": f"c{i}"},
                )
            response = await http.get(f"{base}/metrics")
    assert local.status_code == 200 and paid.headers["x-lanes-route"] == "paid_fallback"
    return response


async def test_the_scrape_parses_with_prometheus_own_parser():
    """Every family parses with a type and help text, none is `unknown`, each has samples, and
    the counters and histograms hold what the traffic did."""
    response = await scrape_after_traffic()
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert {name: f.type for name, f in families.items()} == FAMILIES | {
        name: families[name].type for name in families if name not in FAMILIES
    }
    assert [f.name for f in families.values() if f.type == "unknown"] == []
    assert all(f.documentation for f in families.values())
    missing = {
        "lanes_quota_remaining_requests",
        "lanes_explored_served",
        "lanes_dropped",
    }  # none yet
    assert [n for n, f in families.items() if not f.samples and n not in missing] == []
    jobs = {
        tuple(s.labels[k] for k in ("route", "lane", "model", "outcome")): s.value
        for s in families["lanes_requests"].samples
        if s.name == "lanes_requests_total"
    }
    assert jobs[("local", "local", "local-model", "ok")] == 1
    breakers = {s.labels["model"] for s in families["lanes_model_breaker_state"].samples}
    assert WEIRD in breakers  # the quote and backslashes came back intact
    assert jobs[("paid_fallback", "paid", "paid-model", "ok")] == 31
    tokens = {
        (s.labels["lane"], s.labels["cohort"], s.labels["kind"]): s.value
        for s in families["lanes_tokens"].samples
        if s.name == "lanes_tokens_total"
    }
    assert tokens[("local", "nightly", "prompt")] > 0 and tokens[("paid", "nightly", "completion")]
    cohorts = {s.labels["cohort"] for s in families["lanes_tokens"].samples}
    assert "other" in cohorts and len(cohorts) <= 21  # bounded: 20 cohorts, then "other"
    cost = [s for s in families["lanes_cost_usd"].samples if s.name == "lanes_cost_usd_total"]
    assert cost and all(s.labels["route"] == "paid_fallback" and s.value > 0 for s in cost)
    count = next(
        s.value
        for s in families["lanes_job_duration_seconds"].samples
        if s.name == "lanes_job_duration_seconds_count" and s.labels["route"] == "paid_fallback"
    )
    assert count == 31
    buckets = [
        s.value
        for s in families["lanes_attempt_duration_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["route"] == "local"
    ]
    assert buckets == sorted(buckets) and buckets[-1] == 1  # cumulative, +Inf holds all
    off = {s.labels["lane"]: s.value for s in families["lanes_lane_off"].samples}
    assert off == {"local": 1, "paid": 0, "odd": 1}
    assert families["lanes_state_store_up"].samples[0].value == 1
    assert 'we\\"ird\\\\model' in response.text  # the quote and backslash escaped in the text
