"""Tenants (issue 28, Why 10): a client key sees only its own jobs in every listing — the recent
jobs of `/v1/lanes`, every grouping of `/v1/report` — while the admin sees all; `/metrics` takes
cohort labels from config and admins only, and each client's cohorts are bounded."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
import trio

from lanes.harness.configs import open_sidecar

ADMIN, CI, WEB = "admin-key-0123456789abcdef", "ci-key-0123456789abcdef", "web-key-0123456789abc"
ENV = {"ADMIN_KEY": ADMIN, "CI_KEY": CI, "WEB_KEY": WEB}
SERVER = {"clients": {"ci": "CI_KEY", "web": "WEB_KEY"}, "admin_key_env": "ADMIN_KEY"}
MESSAGES = [{"role": "user", "content": "hi"}]
SECRET = "secret-campaign"


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **headers}


async def job(http: httpx2.AsyncClient, url: str, key: str, cohort: str, model: str) -> str:
    reply = await http.post(
        f"{url}/chat/completions",
        json={"model": model, "messages": MESSAGES},
        headers=auth(key, **{"x-lanes-cohort": cohort}),
    )
    assert reply.status_code == 200, reply.text
    return reply.headers["x-lanes-request-id"]


async def audited(http: httpx2.AsyncClient, url: str, jobs: int) -> None:
    """Wait until the audit holds `jobs` jobs (the state sync writes it within a second)."""
    with trio.fail_after(20):
        while True:
            got = await http.get(f"{url}/report", headers=auth(ADMIN))
            if got.json()["total"]["jobs"] >= jobs:
                return
            await trio.sleep(0.1)


async def test_a_client_sees_only_its_own_jobs():
    """`web` runs a paid job in a cohort of its own; `ci` runs a local one. With ci's key, neither
    `/v1/lanes` nor `/v1/report` (by cohort, class, lane or model) shows web's job id, cohort,
    model or cost — nor counts it, nor its share of the day's paid spend; the admin's key sees
    both."""
    lanes_spec: list[Any] = [("own", "local", ["local-model"]), ("paid", "paid", ["paid-model"])]
    async with (
        open_sidecar(*lanes_spec, server=SERVER, env=ENV) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
    ):
        web_job = await job(http, url, WEB, SECRET, "paid/paid-model")
        ci_job = await job(http, url, CI, "ci-runs", "own/local-model")
        await audited(http, url, 2)
        mine = (await http.get(f"{url}/lanes", headers=auth(CI))).json()
        admin = (await http.get(f"{url}/lanes", headers=auth(ADMIN))).json()
        reports = {
            by: (await http.get(f"{url}/report", params={"by": by}, headers=auth(CI))).json()
            for by in ("cohort", "class", "lane", "model")
        }
        every = await http.get(f"{url}/report", params={"by": "cohort"}, headers=auth(ADMIN))
    assert [r["id"] for r in mine["recent"]] == [ci_job]
    # the day's paid spend too: ci's own (nothing), against its ceiling; the admin's is web's job
    assert mine["paid"]["spent_today_usd"] == 0 and mine["paid"]["client"] == "ci"
    assert admin["paid"]["spent_today_usd"] > 0 and "client" not in admin["paid"]
    assert {r["id"] for r in admin["recent"]} == {ci_job, web_job}
    seen = json.dumps([mine, reports])  # (the lanes themselves list every configured model)
    for leak in (web_job, SECRET, '"web"'):
        assert leak not in seen, leak
    assert "paid-model" not in json.dumps([mine["recent"], reports])
    for by, body in reports.items():
        assert body["total"]["jobs"] == 1 and body["total"]["paid_cost_usd"] == 0, by
        assert sum(h["jobs"] for h in body["hours"]) == 1, by
    assert reports["cohort"]["groups"][0]["key"] == "ci-runs"
    assert {g["key"] for g in every.json()["groups"]} == {SECRET, "ci-runs"}


def cohort_labels(metrics: str) -> set[str]:
    return {
        line.split('cohort="', 1)[1].split('"', 1)[0]
        for line in metrics.splitlines()
        if line.startswith("lanes_tokens_total") and 'cohort="' in line
    }


async def test_metrics_cohorts_come_from_config_and_admins():
    """`web` names 25 cohorts of its own before `ci` names the declared one: `/metrics` shows
    `ads` (declared), the admin's `launch`, and none of web's — those count as `other`."""
    async with (
        open_sidecar(
            ("own", "local", ["local-model"]),
            server=SERVER,
            env=ENV,
            metrics={"cohorts": ["ads"]},
        ) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
    ):
        for i in range(25):
            await job(http, url, WEB, f"web-{i}", "auto")
        await job(http, url, CI, "ads", "auto")
        await job(http, url, ADMIN, "launch", "auto")
        labels = cohort_labels((await http.get(url.removesuffix("/v1") + "/metrics")).text)
    assert labels == {"ads", "launch", "other"}


async def test_a_clients_cohorts_are_bounded(caplog_lanes):
    """With `cohorts_per_client = 3`, web's fourth and later new cohorts are kept as `other` in the
    audit and its report (one warning naming the client); declared ones are never bounded."""
    async with (
        open_sidecar(
            ("own", "local", ["local-model"]),
            server=SERVER,
            env=ENV,
            metrics={"cohorts": ["ads"], "cohorts_per_client": 3},
        ) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
    ):
        for i in range(10):
            await job(http, url, WEB, f"web-{i}", "auto")
        await job(http, url, WEB, "ads", "auto")
        await job(http, url, WEB, "web-1", "auto")  # one it named before: still its own
        await audited(http, url, 12)
        body = (await http.get(f"{url}/report", headers=auth(WEB))).json()
    groups = {g["key"]: g["jobs"] for g in body["groups"]}
    assert groups == {"web-0": 1, "web-1": 2, "web-2": 1, "other": 7, "ads": 1}
    warnings = [
        r.getMessage() for r in caplog_lanes.records if "cohorts_per_client" in r.getMessage()
    ]
    assert len(warnings) == 1 and warnings[0].startswith("client web:")


@pytest.mark.parametrize("by", ["client"])
async def test_a_report_by_client_still_needs_the_admin(by):
    """`by=client` stays the admin's (403 for a client key)."""
    async with (
        open_sidecar(("own", "local", ["local-model"]), server=SERVER, env=ENV) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
    ):
        refused = await http.get(f"{url}/report", params={"by": by}, headers=auth(CI))
        allowed = await http.get(f"{url}/report", params={"by": by}, headers=auth(ADMIN))
    assert (refused.status_code, allowed.status_code) == (403, 200)
