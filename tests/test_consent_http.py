"""Consent over HTTP, through a real sidecar on loopback: admin actions need a key and can not be
forged from a page (nor clicked through a frame), approvals that work ("approve once" then retry,
for exactly one request, never a dearer or another client's one), grants listed and revoked — and,
in the dispatcher, a grant revoked mid-job pays for nothing more."""

from __future__ import annotations

import contextlib
import json
import subprocess

import httpx2
import pytest
import trio
import trio.testing

import lanes
from helpers import PREFILL_PAIR, config, http_client, lanes_command, paid_lane
from lanes._core.engine.recovery import Chunk, Event, relay
from lanes._core.model.candidates import Candidate
from lanes._core.policy.spend import worst_case
from lanes.testing import answer, open_fake, rate_limited, status, stream_cut
from sidecar import CLIENT_KEY, open_sidecar

MESSAGES = [{"role": "user", "content": "Please, the pangram."}]
ADMIN_KEY = "lanes-admin-key-0123456789abcdef"
KEYED = {"clients": {"alice": "CLIENT_KEY"}, "admin_key_env": "ADMIN_KEY"}
ASK = {"free_tier_fallback": "ask", "paid_ceiling_usd_per_day": 1.0, "approval_wait_s": 1}
LANES = (("free", "free", ["free-model"]), ("paid", "paid", ["paid-model"]))
ALICE = {"authorization": f"Bearer {CLIENT_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
PAID = ("paid", "paid", ["paid-model"])
IN, OUT = 1.0, 2.0  # the paid fakes' prices, USD per million tokens (lanes.harness.configs)
PRICED = {"input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}


def free_gone(fakes) -> None:
    fakes["free"].script("free-model", rate_limited(retry_after=600))


async def held(http: httpx2.AsyncClient, url: str, headers: dict[str, str], **extra: str):
    """A request that ends in 429 approval_required (the free lane is rate-limited)."""
    return await http.post(
        f"{url}/chat/completions", json={"messages": MESSAGES}, headers={**headers, **extra}
    )


@pytest.mark.free_lane
async def test_admin_actions_can_not_be_forged():
    """A cross-site form post, a request without the admin key and a guessed approval id all fail
    and change nothing; the admin, sending JSON, can act."""
    async with open_sidecar(*LANES, policy=ASK, server=KEYED, env={"ADMIN_KEY": ADMIN_KEY}) as (
        url,
        fakes,
    ):
        free_gone(fakes)
        base = url.removesuffix("/v1")
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            first = await held(http, url, ALICE)
            approval = first.json()["error"]["approval_id"]
            attempts = {
                "form post from a page": await http.post(
                    f"{url}/approvals/{approval}",
                    content=b"decision=once",
                    headers={
                        "content-type": "application/x-www-form-urlencoded",
                        "origin": "https://evil.example",
                        **ADMIN,
                    },
                ),
                "text/plain post": await http.post(
                    f"{url}/lanes/free/off",
                    content=b'{"x": 1}',
                    headers={"content-type": "text/plain", **ADMIN},
                ),
                "cross-origin JSON": await http.post(
                    f"{url}/lanes/free/off",
                    json={},
                    headers={"origin": "https://evil.example", **ADMIN},
                ),
                "no key": await http.post(f"{url}/approvals/{approval}", json={"decision": "once"}),
                "a client key, not admin": await http.post(
                    f"{url}/approvals/{approval}", json={"decision": "once"}, headers=ALICE
                ),
                "a guessed id": await http.post(
                    f"{url}/approvals/ap-1", json={"decision": "once"}, headers=ADMIN
                ),
                "DNS rebinding": await http.get(
                    f"{url}/lanes", headers={"host": "rebind.example:80", **ALICE}
                ),
            }
            pending = (await http.get(f"{url}/approvals", headers=ALICE)).json()["data"]
            lanes_now = (await http.get(f"{url}/lanes", headers=ALICE)).json()["lanes"]
            unkeyed_view = await http.get(f"{url}/lanes")
            ok = await http.post(f"{url}/lanes/free/off", json={}, headers=ADMIN)
            health = await http.get(f"{base}/health")
    statuses = {name: r.status_code for name, r in attempts.items()}
    assert statuses == {
        "form post from a page": 415,
        "text/plain post": 415,
        "cross-origin JSON": 403,
        "no key": 401,
        "a client key, not admin": 403,
        "a guessed id": 404,
        "DNS rebinding": 421,
    }
    assert all("error" in r.json() for r in attempts.values())  # OpenAI-shaped, every one
    assert [a["id"] for a in pending] == [approval] and len(approval) == 3 + 24  # 96 random bits
    assert not any(lane["off"] for lane in lanes_now)
    assert unkeyed_view.status_code == 401 and health.status_code == 200
    assert ok.status_code == 200 and ok.json() == {"lane": "free", "off": True}
    assert fakes["paid"].requests() == []


@pytest.mark.free_lane
@pytest.mark.parametrize("retry_carries_the_id", [False, True])
async def test_approve_once_then_retry_is_served_by_paid_exactly_once(retry_carries_the_id):
    """429 approval_required, then "approve once", then the client's retry: served by paid, once;
    the next retry asks again. A retry carrying X-Lanes-Approval before the decision joins the same
    approval instead of opening a new one."""
    async with open_sidecar(*LANES, policy=ASK) as (url, fakes):
        free_gone(fakes)
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            first = await held(http, url, {})
            approval = first.json()["error"]["approval_id"]
            if retry_carries_the_id:
                again = await held(http, url, {}, **{"x-lanes-approval": approval})
                assert again.json()["error"]["approval_id"] == approval
            decided = await http.post(f"{url}/approvals/{approval}", json={"decision": "once"})
            grants = (await http.get(f"{url}/grants")).json()["data"]
            served = await held(http, url, {})
            asked_again = await held(http, url, {})
    assert first.status_code == 429 and first.headers["x-lanes-approval"] == approval
    assert decided.json() == {"id": approval, "decision": "once"}
    assert [(g["id"], g["kind"], g["candidate"]) for g in grants] == [
        (approval, "once", "paid/paid-model")
    ]
    assert served.status_code == 200 and served.headers["x-lanes-route"] == "paid_fallback"
    assert asked_again.status_code == 429 and asked_again.json()["error"]["approval_id"] != approval
    assert len(fakes["paid"].requests()) == 1


async def test_a_retry_naming_an_approval_it_can_not_use_is_asked_again_and_told_why():
    """After "approve once", a retry carrying X-Lanes-Approval with another body is asked for a
    new approval, told why, and leaves the once to the request approved; once that used it, naming
    it again is told there is nothing left to use. Paid serves exactly one request."""
    policy = {"free_tier_fallback": "ask", "paid_ceiling_usd_per_day": 1.0, "approval_wait_s": 0.2}
    other = [{"role": "user", "content": "Another question, then."}]
    async with (
        open_sidecar(LANES[1], policy=policy) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        first = await held(http, url, {})
        approval = first.json()["error"]["approval_id"]
        await http.post(f"{url}/approvals/{approval}", json={"decision": "once"})
        named = {"x-lanes-approval": approval}
        another = await http.post(
            f"{url}/chat/completions", json={"messages": other}, headers=named
        )
        served = await held(http, url, named)
        used = await held(http, url, named)
    refused = another.json()["error"]
    assert another.status_code == 429 and refused["approval_id"] != approval
    assert (
        f"X-Lanes-Approval {approval} can not pay for it: it was asked for another request"
        in (refused["message"])
    )
    assert served.status_code == 200 and served.headers["x-lanes-route"] == "paid_fallback"
    assert used.status_code == 429
    assert "no unused approval by that id" in used.json()["error"]["message"]
    assert len(fakes["paid"].requests()) == 1


async def test_approve_once_lets_exactly_one_request_through():
    """docs/security.md: "an 'approve once' is consumed by exactly one request". Four identical
    requests of one client wait on the same approval; one "once" must pay for one of them."""
    async with open_sidecar(PAID, policy={"free_tier_fallback": "ask"}) as (url, fakes):
        codes: list[int] = []
        async with http_client() as http:

            async def held() -> None:
                response = await http.post(
                    f"{url}/chat/completions",
                    json={"messages": MESSAGES},
                    headers={"x-lanes-deadline-ms": "20000"},
                )
                codes.append(response.status_code)

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(held)
                await trio.testing.wait_all_tasks_blocked(cushion=0.2)
                pending = (await http.get(f"{url}/approvals")).json()["data"]
                assert len(pending) == 1
                await http.post(f"{url}/approvals/{pending[0]['id']}", json={"decision": "once"})
    assert len(fakes["paid"].requests()) == 1, codes


async def test_an_approved_embedding_does_not_pay_for_a_different_one():
    """An "approve once" is for the request it was asked for. An embedding's fingerprint leaves
    out its `input`, so the once approved for embedding "hi" (at most $0.000046) pays for the
    client's next, different embedding of 500 KB — no `X-Lanes-Approval` needed."""
    model = {"id": "emb", "input_usd_per_mtok": IN, "output_usd_per_mtok": 0.0, "embedding": True}
    policy = {"free_tier_fallback": "ask", "approval_wait_s": 0.2}
    async with (
        open_sidecar(("paid", "paid", ["emb"], {"models": [model]}), policy=policy) as (
            url,
            fakes,
        ),
        http_client() as http,
    ):
        first = await http.post(f"{url}/embeddings", json={"model": "emb", "input": "hi"})
        approval = first.json()["error"]["approval_id"]
        await http.post(f"{url}/approvals/{approval}", json={"decision": "once"})
        other = await http.post(
            f"{url}/embeddings", json={"model": "emb", "input": ["z" * 100_000] * 5}
        )
        assert fakes["paid"].requests() == []
        same = await http.post(f"{url}/embeddings", json={"model": "emb", "input": "hi"})
    assert first.status_code == 429
    assert other.status_code == 429, other.headers
    assert same.status_code == 200 and len(fakes["paid"].requests()) == 1  # what was approved


async def test_a_retry_naming_an_approval_can_not_spend_more_than_was_approved():
    """The approval shows its worst case ("at most $0.008276") and the admin approves that. A
    request carrying `X-Lanes-Approval` may be a different body: it must not be sent to paid with
    a worst case above the estimate that was approved."""
    policy = {"free_tier_fallback": "ask", "approval_wait_s": 0.2}
    async with open_sidecar(PAID, policy=policy) as (url, fakes), http_client() as http:
        first = await http.post(f"{url}/chat/completions", json={"messages": MESSAGES})
        error = first.json()["error"]
        await http.post(f"{url}/approvals/{error['approval_id']}", json={"decision": "once"})
        bigger = {"messages": [{"role": "user", "content": "y" * 50_000}], "n": 4}
        await http.post(
            f"{url}/chat/completions",
            json=bigger,
            headers={"x-lanes-approval": error["approval_id"]},
        )
    approved = float(error["message"].split("at most $")[1].split(")")[0])
    paid = Candidate(
        lane="paid", model="paid-model", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT
    )
    for request in fakes["paid"].requests():
        body = dict(request.body)
        sent = worst_case(paid, lanes.Job(messages=body.pop("messages"), params=body))
        assert isinstance(sent, float) and sent <= approved + 1e-9, (sent, approved)


@pytest.mark.slow
@pytest.mark.free_lane
async def test_grants_are_listed_and_revoked_over_http_and_the_cli():
    """An hour's grant shows in GET /v1/grants and `lanes approvals grants`, and `lanes approvals
    revoke` ends it: the client is asked again."""
    async with open_sidecar(*LANES, policy=ASK) as (url, fakes):
        free_gone(fakes)
        base = url.removesuffix("/v1")
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            approval = (await held(http, url, {})).json()["error"]["approval_id"]
            await http.post(f"{url}/approvals/{approval}", json={"decision": "1h"})
            granted = await held(http, url, {})
            listed = (await http.get(f"{url}/grants")).json()["data"]

            def cli(*argv: str) -> subprocess.CompletedProcess[str]:
                return lanes_command("approvals", *argv, "--url", base)

            shown = await trio.to_thread.run_sync(cli, "grants")
            revoked = await trio.to_thread.run_sync(cli, "revoke", "grant-anonymous")
            again = await held(http, url, {})
            after = (await http.get(f"{url}/grants")).json()["data"]
            missing = await http.delete(
                f"{url}/grants/grant-anonymous", headers={"content-type": "application/json"}
            )
    assert granted.status_code == 200 and granted.headers["x-lanes-route"] == "paid_fallback"
    assert [(g["id"], g["kind"]) for g in listed] == [("grant-anonymous", "duration")]
    assert shown.returncode == 0 and "grant-anonymous  duration client anonymous" in shown.stdout
    assert revoked.returncode == 0 and "grant-anonymous: revoked" in revoked.stdout
    assert again.status_code == 429 and after == [] and missing.status_code == 404


async def test_a_grant_revoked_mid_stream_is_not_spent_by_its_recovery(env, autojump_clock):
    """No paid request without consent; a grant is revoked with `DELETE /v1/grants/{id}`. A
    stream served by a paid model under a grant keeps `record.approval = "granted"` for the whole
    job, so when the stream is cut after the grant was revoked, the recovery's walk (same record)
    sends a paid request to another model without asking."""
    async with open_fake("c", models=("p1", "p2")) as c:
        c.script("p1", stream_cut(after=3))
        cfg = config(
            paid_lane("c", c.base_url, models=["p1", "p2"]) | PREFILL_PAIR,
            aliases={"pp": ["c/p1", "c/p2"]},  # an alias is not a pinned model: consent is asked
            policy={
                "free_tier_fallback": "ask",
                "paid_attempts": 2,
                "paid_ceiling_usd_per_day": 100.0,
            },
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            approvals = d.approvals
            revoked: list[bool] = []

            async def emit(event: Event) -> None:
                if isinstance(event, Chunk) and not revoked:  # the user stops paid fallback
                    revoked.append(await approvals.revoke("grant-anonymous"))

            async def grant() -> None:
                while not approvals.pending():  # noqa: ASYNC110 - no event for a new approval
                    await trio.sleep(0.05)
                await approvals.decide(approvals.pending()[0].id, 3600.0)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(grant)
                await relay(d, lanes.Job(messages=MESSAGES, model="pp", deadline_s=60), emit)
    assert revoked == [True]
    assert [r.model for r in c.requests()] == ["p1"]


async def test_a_grant_revoked_before_a_retry_pays_for_no_retry(env, autojump_clock):
    """ "A revoked grant pays for nothing more, not even the next attempt of a job that began
    under it." Consent is asked once per candidate, before the walk's same-candidate retry loop:
    a paid attempt that fails transiently (a 503) is retried on the same model after the grant
    was revoked, without asking again."""
    async with open_fake("c", models=("p1",)) as c:
        c.script("p1", status(503), answer())
        cfg = config(
            paid_lane("c", c.base_url, models=["p1"]) | {"models": [{"id": "p1", **PRICED}]},
            aliases={"pp": ["c/p1"]},  # an alias is not a pinned model: consent is asked
            policy={
                "free_tier_fallback": "ask",
                "paid_attempts": 2,
                "transient_retries": 1,
                "paid_ceiling_usd_per_day": 100.0,
            },
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            approvals = d.approvals
            revoked: list[bool] = []

            async def grant_then_revoke() -> None:
                while not approvals.pending():  # noqa: ASYNC110 - no event for a new approval
                    await trio.sleep(0.001)
                await approvals.decide(approvals.pending()[0].id, 3600.0)
                while not c.requests():  # noqa: ASYNC110 - the fake sets no event
                    await trio.sleep(0.001)
                revoked.append(await approvals.revoke("grant-anonymous"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(grant_then_revoke)
                with contextlib.suppress(lanes.JobFailed):
                    await d.complete(lanes.Job(messages=MESSAGES, model="pp", deadline_s=60))
    assert revoked == [True]
    assert len(c.requests("p1")) == 1


@pytest.mark.free_lane
async def test_an_approval_expires_with_its_job_and_a_short_deadline_is_a_504():
    """A pending approval disappears when its job's deadline passes; a deadline too short to ask
    is a 504 and leaves no approval behind."""
    policy = {**ASK, "approval_wait_s": None}
    async with open_sidecar(*LANES, policy=policy) as (url, fakes):
        free_gone(fakes)
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            short = await held(http, url, {}, **{"x-lanes-deadline-ms": "300"})
            after_short = (await http.get(f"{url}/approvals")).json()["data"]
            waited = await held(http, url, {}, **{"x-lanes-deadline-ms": "1500"})
            after_wait = (await http.get(f"{url}/approvals")).json()["data"]
    assert short.status_code == 504 and short.json()["error"]["code"] == "deadline_exceeded"
    assert after_short == []
    assert waited.status_code == 429 and waited.json()["error"]["code"] == "approval_required"
    assert after_wait == []  # its job's deadline passed with it


@pytest.mark.free_lane
async def test_the_approval_names_the_model_that_fits_and_that_model_serves():
    """With two paid models, the first costing more than the ceiling has left, the approval asks
    for the second, with an estimate within the ceiling, and the approved job runs on it."""
    expensive = {
        "models": [{"id": "big", "input_usd_per_mtok": 5000.0, "output_usd_per_mtok": 5000.0}]
    }
    cheap = {"models": [{"id": "small", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}]}
    lanes_ = (
        ("free", "free", ["free-model"]),
        ("big", "paid", ["big"], expensive),
        ("small", "paid", ["small"], cheap),
    )
    async with open_sidecar(*lanes_, policy={**ASK, "paid_ceiling_usd_per_day": 0.05}) as (
        url,
        fakes,
    ):
        free_gone(fakes)
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            first = await held(http, url, {})
            [pending] = (await http.get(f"{url}/approvals")).json()["data"]
            await http.post(f"{url}/approvals/{pending['id']}", json={"decision": "once"})
            served = await held(http, url, {})
    assert first.status_code == 429
    assert pending["candidate"] == "small/small" and 0 < pending["estimated_cost_usd"] <= 0.05
    assert served.status_code == 200 and served.headers["x-lanes-lane"] == "small"
    assert fakes["big"].requests() == []


async def test_a_public_bind_needs_a_key_that_resolves():
    """Binding a non-loopback address with client-key variables unset is refused, naming them."""
    from lanes import ConfigError, load_config
    from lanes._http.server import serve

    config = load_config({"server": {"clients": {"ci": "LANES_KEY_CI_UNSET"}}}, env={})
    with pytest.raises(ConfigError, match="LANES_KEY_CI_UNSET unset or empty"):
        await serve(config, host="0.0.0.0", port=0, env={"LANES_KEY_CI_UNSET": "  "})


@pytest.mark.free_lane
async def test_a_page_can_not_spend_through_any_door():
    """With no keys (loopback, one anonymous client) a page of another origin still can not run a
    job — chat, responses, messages or embeddings — by a form-typed body or a cross-origin fetch;
    the same requests from a program (JSON, no Origin) are served."""
    allow = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0}
    bodies = {
        "/chat/completions": {"messages": MESSAGES},
        "/responses": {"model": "auto", "input": "hi"},
        "/messages": {"model": "auto", "max_tokens": 16, "messages": MESSAGES},
    }
    async with (
        open_sidecar(("paid", "paid", ["paid-model"]), policy=allow) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        forged = []
        for path, body in bodies.items():
            raw = json.dumps(body).encode()
            forged += [
                await http.post(url + path, content=raw, headers={"content-type": kind})
                for kind in ("text/plain", "application/x-www-form-urlencoded")
            ]
            forged.append(
                await http.post(url + path, json=body, headers={"origin": "https://evil.example"})
            )
            forged.append(
                await http.post(url + path, json=body, headers={"sec-fetch-site": "cross-site"})
            )
        forged.append(
            await http.post(
                f"{url}/embeddings",
                content=b'{"model": "paid/paid-model", "input": "x"}',
                headers={"content-type": "text/plain"},
            )
        )
        assert fakes["paid"].requests() == []
        served = [await http.post(url + path, json=body) for path, body in bodies.items()]
    assert [r.status_code for r in forged] == [415, 415, 403, 403] * 3 + [415]
    assert {r.json()["error"]["type"] for r in forged if r.status_code == 415} == {
        "invalid_request_error"
    }
    assert [r.status_code for r in served] == [200, 200, 200]
    assert len(fakes["paid"].requests()) == 3


async def test_the_page_can_not_be_framed_by_another_origin():
    """The page is the console (lane switches, approvals): a page of another origin that frames
    it can make the user's click land on a button (clickjacking). It must say `frame-ancestors
    'none'` (or `X-Frame-Options: DENY`)."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _fakes),
        http_client() as http,
    ):
        page = await http.get(url.removesuffix("/v1") + "/")
    policy = page.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy and page.headers.get("x-frame-options") == "DENY"


@pytest.mark.free_lane
async def test_a_client_sees_only_its_own_approvals_grants_and_requests():
    """With client keys, a client lists only its own pending approvals and grants, can not read
    another client's request story (404, as if unknown) and can not group the report by client;
    the admin sees everything."""
    bob_key = "lanes-bob-key-0123456789abcdef"
    server = {"clients": {"alice": "CLIENT_KEY", "bob": "BOB_KEY"}, "admin_key_env": "ADMIN_KEY"}
    env = {"ADMIN_KEY": ADMIN_KEY, "BOB_KEY": bob_key}
    bob = {"authorization": f"Bearer {bob_key}"}
    async with (
        open_sidecar(*LANES, policy=ASK, server=server, env=env) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        free_gone(fakes)
        asked = await held(http, url, ALICE)
        approval = asked.json()["error"]["approval_id"]
        request_id = asked.headers["x-lanes-request-id"]
        pending = {
            who: [a["id"] for a in (await http.get(f"{url}/approvals", headers=h)).json()["data"]]
            for who, h in (("alice", ALICE), ("bob", bob), ("admin", ADMIN))
        }
        await http.post(f"{url}/approvals/{approval}", json={"decision": "1h"}, headers=ADMIN)
        story = f"{url}/requests/{request_id}"
        with trio.fail_after(30):  # the audit row is written by the next sync (0.5 s idle)
            while (await http.get(story, headers=ADMIN)).status_code != 200:  # noqa: ASYNC110 - an HTTP poll, no event to wait on
                await trio.sleep(0.05)
        seen = {
            who: {
                "grants": (await http.get(f"{url}/grants", headers=h)).json()["data"],
                "story": (await http.get(f"{url}/requests/{request_id}", headers=h)).status_code,
                "by client": (
                    await http.get(f"{url}/report", params={"by": "client"}, headers=h)
                ).status_code,
            }
            for who, h in (("alice", ALICE), ("bob", bob), ("admin", ADMIN))
        }
        never = await http.get(f"{url}/requests/req-never-made", headers=ADMIN)
    assert (never.status_code, never.json()["error"]["code"]) == (404, "request_not_found")
    assert [g["client"] for g in seen["alice"]["grants"]] == ["alice"]
    assert pending == {"alice": [approval], "bob": [], "admin": [approval]}
    assert seen["bob"]["grants"] == []
    assert [g["client"] for g in seen["admin"]["grants"]] == ["alice"]
    assert [seen[w]["story"] for w in ("alice", "bob", "admin")] == [200, 404, 200]
    assert [seen[w]["by client"] for w in ("alice", "bob", "admin")] == [403, 403, 200]


async def test_another_clients_approval_id_pays_for_nothing():
    """Held: bob's request carrying alice's approved "once" (X-Lanes-Approval) is asked again;
    alice's own retry is the one served."""
    policy = {"free_tier_fallback": "ask", "approval_wait_s": 0.2}
    server = {"clients": {"alice": "CLIENT_KEY", "bob": "BOB_KEY"}, "admin_key_env": "ADMIN_KEY"}
    env = {"BOB_KEY": "bob-key-0123456789abcdefghij", "ADMIN_KEY": ADMIN_KEY}
    alice = {"authorization": f"Bearer {CLIENT_KEY}"}
    bob = {"authorization": "Bearer bob-key-0123456789abcdefghij"}
    async with (
        open_sidecar(PAID, policy=policy, server=server, env=env) as (url, fakes),
        http_client() as http,
    ):
        first = await http.post(
            f"{url}/chat/completions", json={"messages": MESSAGES}, headers=alice
        )
        approval = first.json()["error"]["approval_id"]
        decided = await http.post(
            f"{url}/approvals/{approval}",
            json={"decision": "once"},
            headers={"authorization": f"Bearer {ADMIN_KEY}"},
        )
        by_bob = await http.post(
            f"{url}/chat/completions",
            json={"messages": MESSAGES},
            headers={**bob, "x-lanes-approval": approval},
        )
        by_alice = await http.post(
            f"{url}/chat/completions", json={"messages": MESSAGES}, headers=alice
        )
    assert decided.status_code == 200
    assert by_bob.status_code == 429 and by_bob.json()["error"]["approval_id"] != approval
    assert by_alice.status_code == 200 and len(fakes["paid"].requests()) == 1
