"""Explain every cent: the cohort report adds up to the ledger and to the upstreams' own counts, the
story of any request, clients' own budgets across processes, and bring-your-own-key lanes."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import lanes
from bench.freeshare import arrivals
from helpers import (
    PREFILL_PAIR,
    config,
    free_lane,
    http_client,
    lanes_command,
    paid_lane,
    spent,
)
from lanes._cli_reports import story_text
from lanes._core.audit.report import explain, report
from lanes._core.state.audit import audit_row
from lanes._core.state.store import SQLiteStore
from lanes.harness.configs import KEYS
from lanes.harness.processes import dump_toml, open_sidecar_processes
from lanes.testing import answer, open_fake, quota, rate_limited, status, stream_cut
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "Plan my week."}]
COHORTS = ("ads", "organic", "partner")


@pytest.mark.free_lane
async def test_a_simulated_morning_adds_up(env, tmp_path, autojump_clock):
    """The benchmark's traffic model over two free lanes with quotas and a paid fallback, in three
    cohorts: the report's paid spend per cohort sums exactly to the ledger, and its attempt counts
    to the requests the upstreams received."""
    state = str(tmp_path / "day.db")
    times = arrivals(0.5)[:300]
    async with (
        open_fake("a", models=("m",)) as a,
        open_fake("b", models=("m",)) as b,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        a.script("m", quota(10), answer())
        b.script("m", quota(5), answer())
        cfg = config(
            free_lane("a", a.base_url, models=["m"], free_tier={"kind": "rate_limited", "rpm": 10}),
            free_lane("b", b.base_url, models=["m"], free_tier={"kind": "rate_limited", "rpm": 5}),
            paid_lane("paid", paid.base_url),
            state=state,
            policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 0.02},
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            start = trio.current_time()

            async def one(i: int, at: float) -> None:
                await trio.sleep_until(start + at)
                with contextlib.suppress(lanes.JobFailed):  # refused jobs are audited too
                    await d.complete(
                        lanes.Job(messages=MESSAGES, cohort=COHORTS[i % 3], deadline_s=20)
                    )

            async with trio.open_nursery() as nursery:
                for i, at in enumerate(times):
                    nursery.start_soon(one, i, at)
            await trio.sleep(1)  # one sync: the audit reaches the file
            query = d.store.records.query
            by_cohort = report(query, since=0.0, by="cohort", ceiling_usd=0.02)
            (ledger,) = query(
                "SELECT COALESCE(SUM(COALESCE(settled, reserved)), 0) FROM paid_ledger"
            )[0]
    groups = {g.key: g for g in by_cohort.groups}
    assert set(groups) == set(COHORTS) and by_cohort.total.jobs == len(times)
    assert sum(g.paid_cost_usd for g in groups.values()) == pytest.approx(ledger, abs=1e-12)
    assert ledger > 0 and by_cohort.total.paid_jobs > 0
    sent = len(a.requests()) + len(b.requests()) + len(paid.requests())
    assert sum(g.requests for g in groups.values()) == sent
    share = by_cohort.total.free_share
    assert share is not None and 0 < share < 1 and by_cohort.days[0].ceiling_usd == 0.02


@pytest.mark.free_lane
@pytest.mark.parametrize("outcome", [1, 2, 3])
async def test_explain_tells_the_worked_examples_apart(outcome, env, tmp_path, autojump_clock):
    """Seed 004's three outcomes — free primary, free retry, paid fallback — each read back from
    the audit as its own story, with every attempt, its route state and its cost."""
    state = str(tmp_path / "explain.db")
    async with (
        open_fake("a", models=("free-a",)) as a,
        open_fake("b", models=("free-b",)) as b,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        if outcome >= 2:
            a.script("free-a", rate_limited(retry_after=30))
        if outcome == 3:
            b.script("free-b", rate_limited(retry_after=30))
        cfg = config(
            free_lane("a", a.base_url, models=["free-a"]),
            free_lane("b", b.base_url, models=["free-b"]),
            paid_lane("paid", paid.base_url),
            state=state,
            policy={"free_tier_fallback": "allow"},
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            reply = await d.complete(lanes.Job(messages=MESSAGES, cohort="ads"))
            await trio.sleep(1)
            story = explain(d.store.records.query, reply.request_id)
    assert story is not None
    routes = [(s["route"], s["lane"], s["outcome"]) for s in story["attempt_list"]]
    expected = {
        1: [("primary", "a", "ok")],
        2: [("primary", "a", "rate_limited"), ("free_retry", "b", "ok")],
        3: [
            ("primary", "a", "rate_limited"),
            ("free_retry", "b", "rate_limited"),
            ("paid_fallback", "paid", "ok"),
        ],
    }[outcome]
    assert routes == expected
    head = {
        1: "answered by a/free-a on the primary route after 1 attempt(s), $0.000000",
        2: "answered by b/free-b on the free_retry route after 2 attempt(s), $0.000000",
        3: "answered by paid/paid-model on the paid_fallback route after 3 attempt(s), $",
    }
    assert story["summary"].startswith(head[outcome])
    assert story["plan"] == ["a/free-a", "b/free-b", "paid/paid-model"]
    if outcome == 3:
        assert story["cost_usd"] == pytest.approx(reply.cost_usd) and story["cost_usd"] > 0
        assert story["paid_after_usd"] - story["paid_before_usd"] == pytest.approx(reply.cost_usd)
        assert "paid consent: allow" in story["summary"]
    else:
        assert story["paid_before_usd"] is None and story["cost_usd"] == 0
    assert "Plan my week" not in json.dumps(story)  # hashes and sizes, never the body


async def test_a_recovered_stream_explains_every_cent(tmp_path):
    """ "The reply's cost, the SSE trailer, the audit and /v1/lanes show the same settled figure",
    and `lanes explain` tells the request's story. After a cut paid stream is resumed, the
    recovery's audit row (same job id) replaces the first one: the cut attempt's full
    reservation is in the ledger but in neither the trailer nor the story. (`paid_attempts = 2`:
    the job may send the second paid request a recovery needs.)"""
    policy = {"free_tier_fallback": "allow", "paid_attempts": 2}
    async with open_sidecar(
        ("paid", "paid", ["p1", "p2"], PREFILL_PAIR),
        policy=policy,
        aliases={"pp": ["paid/p1", "paid/p2"]},
        state=str(tmp_path / "state.db"),
    ) as (url, fakes):
        fakes["paid"].script("p1", stream_cut(after=3))
        async with http_client() as http:
            streamed = await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "model": "pp", "stream": True},
            )
            request_id = streamed.headers["x-lanes-request-id"]
            with trio.fail_after(10):
                story = await http.get(f"{url}/requests/{request_id}")
                while story.status_code != 200:  # the audit row is flushed in the background
                    await trio.sleep(0.05)
                    story = await http.get(f"{url}/requests/{request_id}")
            ledger = await spent(http, url)
    trailer = float(streamed.text.split("cost_usd=")[1].split()[0])
    assert len(story.json()["attempt_list"]) == 2, story.json()["summary"]
    assert story.json()["cost_usd"] == pytest.approx(ledger)
    assert trailer == pytest.approx(ledger)


@pytest.mark.slow
async def test_lanes_report_and_explain_read_the_state_file(env, tmp_path, autojump_clock):
    """`lanes report --by cohort` and `lanes explain ID` read a config's state file, as text,
    JSON and Markdown."""
    state = tmp_path / "cli.db"
    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(paid_lane("paid", paid.base_url), state=str(state))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            reply = await d.complete(
                lanes.Job(messages=MESSAGES, model="paid/paid-model", cohort="ads")
            )
            await trio.sleep(1)
    path = tmp_path / "lanes.toml"
    path.write_text(dump_toml({"state": str(state)}))
    md = tmp_path / "report.md"

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return lanes_command(*argv, "--config", str(path))

    text = await trio.to_thread.run_sync(cli, "report", "--since", "7d", "--md", str(md))
    data = await trio.to_thread.run_sync(cli, "report", "--json", "--by", "model")
    story = await trio.to_thread.run_sync(cli, "explain", reply.request_id)
    missing = await trio.to_thread.run_sync(cli, "explain", "no-such-id")
    assert (
        text.returncode == 0 and "| ads | 1 | 1 |" in text.stdout and md.read_text() == text.stdout
    )
    assert json.loads(data.stdout)["groups"][0]["key"] == "paid-model"
    # the same figures over time: per UTC day (against the ceiling) and per UTC hour
    day, hour = json.loads(data.stdout)["days"], json.loads(data.stdout)["hours"]
    assert [(d["jobs"], d["paid_share"]) for d in day] == [(1, 1.0)] and len(hour) == 1
    cost = f"${reply.cost_usd:.6f}"
    assert f"| 1 | 1 | 0.0 % | 100.0 % | 1.00 | {cost} | $1.00 |" in text.stdout
    hour_cell = time.strftime("%Y-%m-%d %H:00", time.gmtime(hour[0]["hour"]))
    assert f"| {hour_cell} | 1 | 1 | 0.0 % | 100.0 % | 1.00 | {cost} |" in text.stdout
    assert story.returncode == 0 and reply.request_id in story.stdout
    assert "attempt 1: paid_fallback paid/paid-model → ok" in story.stdout
    assert missing.returncode == 1


@pytest.mark.slow
async def test_a_clients_budget_holds_across_two_processes(tmp_path):
    """Alice's own ceiling ($0.01 a day) holds across two sidecar processes sharing one state file,
    while Bob, without one, still gets paid fallback under the global ceiling."""
    alice, bob = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(delay_s=0.2))
        conf = {
            "state": str(tmp_path / "clients.db"),
            "policy": {
                "free_tier_fallback": "allow",
                "paid_ceiling_usd_per_day": 1.0,
                "paid_max_tokens": 100,
            },
            "server": {
                "clients": {
                    "alice": {
                        "key_env": "ALICE_KEY",
                        "paid_ceiling_usd_per_day": 0.01,
                        "cohort": "ads",
                    },
                    "bob": "BOB_KEY",
                }
            },
            "lanes": [paid_lane("paid", paid.base_url)],
        }
        env = {**KEYS, "ALICE_KEY": alice, "BOB_KEY": bob}
        async with (
            open_sidecar_processes(conf, tmp_path, count=2, env=env) as sidecars,
            httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        ):
            statuses: dict[str, list[int]] = {"alice": [], "bob": []}

            async def one(i: int, who: str, key: str) -> None:
                r = await http.post(
                    f"{sidecars[i % 2].base}/v1/chat/completions",
                    json={"messages": MESSAGES, "model": "paid/paid-model"},
                    headers={"authorization": f"Bearer {key}"},
                )
                statuses[who].append(r.status_code)

            async with trio.open_nursery() as nursery:
                for i in range(60):
                    nursery.start_soon(one, i, "alice", alice)
            await trio.sleep(1.0)  # settlements reach the file
            for i in range(4):
                await one(i, "bob", bob)
    worst = (
        len(
            json.dumps(
                {"max_tokens": 100, "model": "paid-model", "messages": MESSAGES},
                separators=(",", ":"),
            ).encode()
        )
        + 100 * 2
    ) / 1e6
    with sqlite3.connect(tmp_path / "clients.db") as db:
        (alice_spent, alice_rows, alice_reserved) = db.execute(
            "SELECT SUM(COALESCE(settled, reserved)), COUNT(*), SUM(reserved) FROM paid_ledger "
            "WHERE client = 'alice'"
        ).fetchone()
        cohorts = dict(db.execute("SELECT client, cohort FROM audit GROUP BY client").fetchall())
    assert alice_spent <= 0.01 + 1e-12 and cohorts == {"alice": "ads", "bob": ""}
    # every answer is a reservation of at most the worst case; more than 0.01 / worst of them
    # only as settlements (the answers' real, smaller cost) made room meanwhile — on a loaded
    # machine the first answers settle before the last requests reserve
    served = statuses["alice"].count(200)
    assert 0 < served == alice_rows and alice_reserved <= served * worst + 1e-12
    assert served <= int(0.01 / worst) or alice_reserved > 0.01
    assert statuses["alice"].count(429) == 60 - served > 0  # and her ceiling did refuse
    assert statuses["bob"] == [200, 200, 200, 200]


async def test_a_byok_key_is_used_once_and_never_shown(tmp_path, caplog):
    """A bring-your-own-key lane uses the key the request carries, for that request only, outside
    the shared quotas and ceiling; the key appears in no log, page, metric, error, audit row or
    state file."""
    caplog.set_level(logging.DEBUG)
    key = "sk-byok-client-secret-7d41f09"
    byok = {"byok": True, "free_tier": {"kind": "rate_limited", "rpm": 1}}
    state = tmp_path / "byok.db"
    async with open_sidecar(
        ("mine", "free", ["own-model"], byok),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "off"},
        state=str(state),
    ) as (url, fakes):
        fakes["mine"].script(
            "own-model", status(401, {"error": {"message": f"bad key {key}"}}), answer()
        )
        base, seen = url.removesuffix("/v1"), []
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            headers = {"x-lanes-key-mine": key}
            refused = await http.post(
                f"{url}/chat/completions", json={"messages": MESSAGES}, headers=headers
            )
            served = await http.post(
                f"{url}/chat/completions", json={"messages": MESSAGES}, headers=headers
            )
            without = await http.post(f"{url}/chat/completions", json={"messages": MESSAGES})
            await trio.sleep(1)
            for path in (
                "/",
                "/metrics",
                "/v1/lanes",
                "/v1/models",
                "/v1/approvals",
                "/v1/grants",
                "/v1/report",
                f"/v1/requests/{served.headers['x-lanes-request-id']}",
            ):
                seen.append((await http.get(base + path)).text)
            seen += [refused.text, served.text, without.text, json.dumps(dict(served.headers))]
    seen += [r.getMessage() for r in caplog.records]
    # the state file, its log, and the batch queue's folder beside it
    kept = [
        p
        for p in Path(tmp_path).rglob("*")  # noqa: ASYNC240 - the sidecar is closed: nothing else runs
        if p.is_file() and p.relative_to(tmp_path).parts[0].startswith("byok.db")
    ]
    files = b"".join(p.read_bytes() for p in kept)
    assert refused.status_code == 401 and served.status_code == 200
    assert served.headers["x-lanes-route"] == "byok" and served.headers["x-lanes-lane"] == "mine"
    assert without.status_code == 503 and "no key for it in the request" in without.text
    assert all(r.authorization for r in fakes["mine"].requests())  # the client's key was sent
    assert key not in "\n".join(seen) and key.encode() not in files
    assert fakes["paid"].requests() == []


def test_audit_retention_deletes_old_jobs():
    """Jobs older than `audit_days` are deleted, with their attempts; newer ones stay."""
    store = SQLiteStore(":memory:")
    rows = [
        {"job": f"j{i}", "at": at, "attempt_rows": [{"job": f"j{i}", "n": 0, "at": at}]}
        for i, at in enumerate((100.0, 200.0, 300.0))
    ]
    store.records.add_audit(rows)
    assert store.records.prune_audit(250.0) == 2
    assert store.records.query("SELECT job FROM audit") == [("j2",)]
    assert store.records.query("SELECT job FROM audit_attempt") == [("j2",)]


AUDITED_JOB = st.fixed_dictionaries(
    {
        "at": st.floats(0, 5 * 86400, allow_nan=False),
        "outcome": st.sampled_from(["ok", "ok", "ok", "free_tier_exhausted", "deadline_exceeded"]),
        "tier": st.sampled_from(["local", "byok", "free", "paid"]),
        "route": st.sampled_from(["local", "byok", "primary", "free_retry", "paid_fallback"]),
        "attempts": st.integers(0, 6),
        "cost_usd": st.sampled_from([0.0, 0.000125, 0.03]),
    }
)


@given(jobs=st.lists(AUDITED_JOB, max_size=30), since=st.floats(0, 5 * 86400))
def test_the_report_over_time_is_its_jobs_hour_by_hour(jobs, since):
    """Each hour of the report holds exactly its jobs (answers, free and paid shares of them,
    attempts per answer, paid cost); the days add up their hours, and both add up to the total."""
    store = SQLiteStore(":memory:")
    store.records.add_audit([{**j, "job": f"j{i}", "attempt_rows": []} for i, j in enumerate(jobs)])
    got = report(store.records.query, since=since, by="cohort", ceiling_usd=0.5)
    by_hour: dict[int, list[dict[str, Any]]] = {}
    for j in jobs:
        if j["at"] // 3600 >= since // 3600:
            by_hour.setdefault(int(j["at"] // 3600), []).append(j)
    assert [h.hour for h in got.hours] == [h * 3600.0 for h in sorted(by_hour)]
    for h in got.hours:
        mine = by_hour[int(h.hour // 3600)]
        ok = [j for j in mine if j["outcome"] == "ok"]
        free = sum(j["tier"] in ("local", "free") for j in ok)
        paid = sum(j["route"] == "paid_fallback" for j in ok)
        assert (h.jobs, h.answered) == (len(mine), len(ok))
        assert h.free_share == (pytest.approx(free / len(ok)) if ok else None)
        assert h.paid_share == (pytest.approx(paid / len(ok)) if ok else None)
        per = sum(j["attempts"] for j in ok) / len(ok) if ok else None
        assert h.attempts_per_answer == (pytest.approx(per) if ok else None)
        assert h.paid_cost_usd == pytest.approx(sum(j["cost_usd"] for j in mine))
    assert [d.day for d in got.days] == sorted(
        {time.strftime("%Y-%m-%d", time.gmtime(h.hour)) for h in got.hours}
    )
    for d in got.days:
        hours = [h for h in got.hours if time.strftime("%Y-%m-%d", time.gmtime(h.hour)) == d.day]
        assert d.jobs == sum(h.jobs for h in hours) and d.answered == sum(h.answered for h in hours)
        assert d.paid_cost_usd == pytest.approx(sum(h.paid_cost_usd for h in hours))
        assert d.ceiling_usd == 0.5
        if d.answered:
            paid = sum((h.paid_share or 0) * h.answered for h in hours)
            assert d.paid_share == pytest.approx(paid / d.answered)
    assert sum(d.jobs for d in got.days) == got.total.jobs
    assert sum(d.paid_cost_usd for d in got.days) == pytest.approx(got.total.paid_cost_usd)


def test_the_report_groups_by_what_the_roll_ups_keep():
    """`lanes report --by` offers exactly the dimensions the audit is rolled up by."""
    from lanes._core.audit.report import GROUPS
    from lanes._core.state.audit import DIMENSIONS

    assert GROUPS == DIMENSIONS


#: The `audit` table as the first release created it, before any of `audit_tables.ADDED`.
FIRST_AUDIT = """CREATE TABLE audit (
    job TEXT PRIMARY KEY, at FLOAT, client TEXT, cohort TEXT, class TEXT, route TEXT,
    outcome TEXT, lane TEXT, model TEXT, request_sha256 TEXT, request_bytes INTEGER,
    answer_sha256 TEXT, answer_bytes INTEGER, attempts INTEGER, attempt_log TEXT, skip_log TEXT,
    latency_s FLOAT, tokens INTEGER, cost_usd FLOAT, approval TEXT, explored INTEGER, body TEXT)"""


def test_a_state_file_from_before_dropped_opens_and_explains(tmp_path):
    """A state file whose audit has no `dropped` column opens: its old rows tell no drops, new
    rows keep theirs."""
    path = str(tmp_path / "old.db")
    with sqlite3.connect(path) as conn:
        conn.execute(FIRST_AUDIT)
        conn.execute(
            "INSERT INTO audit VALUES ('old', 1.0, 'anonymous', '', 'general', 'primary', 'ok', "
            "'l', 'm', 'ab', 2, 'cd', 3, 1, '[]', '[]', 0.5, 7, 0.0, '', 0, '')"
        )
    store = SQLiteStore(path)
    job = lanes.Job(messages=MESSAGES, dropped=["client_metadata", "tools.web_search"])
    row = audit_row(
        job=job,
        at=2.0,
        request_class="general",
        outcome="ok",
        route="primary",
        lane="l",
        model="m",
        attempts=(),
        latency_s=0.1,
    )
    store.records.add_audit([row])
    old, new = explain(store.records.query, "old"), explain(store.records.query, job.id)
    assert old is not None and old["dropped"] == [] and old["summary"]
    assert new is not None and new["dropped"] == ["client_metadata", "tools.web_search"]
    assert "dropped (not sent): client_metadata, tools.web_search" in story_text(new)
    assert "dropped" not in story_text(old)
