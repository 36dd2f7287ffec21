"""A hostile review's findings, each kept as the test that showed it.

Every test here asserts what README, `docs/security.md` or issues 15, 16, 19 and 21 promise; each
failed before its fix (as a strict xfail) and now guards it. Everything runs against a real sidecar
on loopback (`open_sidecar`: `serve` on real sockets) in front of `lanes.testing` fakes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Mapping
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

import lanes
from lanes._core.model.job import Candidate
from lanes._core.policy.spend import billed_bytes, paid_request, worst_case
from lanes.testing import answer, raw, status, stream_cut
from sidecar import CLIENT_KEY, open_sidecar

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
IN, OUT = 1.0, 2.0  # the paid fakes' prices, USD per million tokens (lanes.testing.harness.configs)
PAID = ("paid", "paid", ["paid-model"])
ADMIN_KEY = "lanes-admin-key-0123456789abcdef"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def client(**kw: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(trust_env=False, timeout=30, **kw)


async def spent(http: httpx2.AsyncClient, url: str, headers: Mapping[str, str] = {}) -> float:
    """Today's paid spend as the ledger has it (reservations and settlements)."""
    state = (await http.get(f"{url}/lanes", headers=dict(headers))).json()
    return float(state["paid"]["spent_today_usd"])


def openai_shaped(response: httpx2.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


# == money ========================================================================================


@pytest.mark.free_lane
async def test_a_free_openrouter_request_can_not_buy_paid_models_or_plugins():
    """With `free_tier_fallback = off`, a job on OpenRouter's free model never carries the
    router's own spending switches — `models` (fallback to other, paid models), `plugins` (the
    web plugin is billed per result), `route` — to the provider: a free lane has no reservation
    and no consent, so these would bill the operator's account behind the ceiling."""
    router = (
        "or",
        "free",
        ["m:free"],
        {"module": "openrouter", "free_tier": {"kind": "free_models"}},
    )
    async with (
        open_sidecar(router, policy={"free_tier_fallback": "off"}) as (url, fakes),
        client() as http,
    ):
        await http.post(
            f"{url}/chat/completions",
            json={
                "messages": MESSAGES,
                "models": ["openai/o1-pro", "anthropic/claude-opus-4"],
                "plugins": [{"id": "web"}],
                "route": "fallback",
            },
        )
    sent = [dict(r.body) for r in fakes["or"].requests()]
    assert not any({"models", "plugins", "route"} & set(body) for body in sent), sent


@pytest.mark.parametrize(
    "extra",
    [
        {"service_tier": "priority"},  # OpenAI bills priority processing above the list price
        {"web_search_options": {}},  # search models bill a fee per call, beside tokens
        {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
        {"prediction": {"type": "content", "content": "x" * 2000}},  # rejected: output price
    ],
    ids=["service_tier", "web_search_options", "audio_output", "prediction"],
)
async def test_a_paid_attempt_never_carries_a_billing_switch_the_reservation_does_not_price(extra):
    """The reservation prices input bytes, the output cap, images and `n` — nothing else — so a
    paid attempt must not send a parameter that makes the provider bill more than that (or the
    request must be refused for paid, as audio input is)."""
    async with (
        open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes),
        client() as http,
    ):
        await http.post(f"{url}/chat/completions", json={"messages": MESSAGES, **extra})
    sent = [dict(r.body) for r in fakes["paid"].requests()]
    assert not any(set(extra) & set(body) for body in sent), sent


async def test_approve_once_lets_exactly_one_request_through():
    """docs/security.md: "an 'approve once' is consumed by exactly one request". Four identical
    requests of one client wait on the same approval; one "once" must pay for one of them."""
    async with open_sidecar(PAID, policy={"free_tier_fallback": "ask"}) as (url, fakes):
        codes: list[int] = []
        async with client() as http:

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
        client() as http,
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
    async with open_sidecar(PAID, policy=policy) as (url, fakes), client() as http:
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


async def test_a_gateway_timeout_from_a_paid_upstream_stays_counted():
    """ "A lost answer ... keeps the full reservation." A 504 (or 502) from the gateway in front
    of a provider is a lost answer: the model may have run and billed. It settles at $0 today, as
    if the provider had refused the request."""
    async with open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes):
        fakes["paid"].script("paid-model", status(504, {"error": {"message": "gateway timeout"}}))
        async with client() as http:
            response = await http.post(f"{url}/chat/completions", json={"messages": MESSAGES})
            ledger = await spent(http, url)
    assert response.status_code >= 500 and len(fakes["paid"].requests()) == 1
    assert ledger > 0.0


async def test_usage_whose_total_exceeds_its_parts_is_not_believed():
    """Some providers bill reasoning (or audio, cache) tokens outside `completion_tokens` and count
    them in `total_tokens` only. Usage whose total is 2,000× its parts is not sane: it must settle
    at no less than its total at the input price (the reservation), not at 2 tokens."""
    usage = {
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "total_tokens": 4000,
        "completion_tokens_details": {"reasoning_tokens": 3998},
    }
    async with open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes):
        fakes["paid"].script("paid-model", answer(usage=usage))
        async with client() as http:
            response = await http.post(f"{url}/chat/completions", json={"messages": MESSAGES})
            ledger = await spent(http, url)
    assert response.status_code == 200
    assert ledger >= 4000 * IN / 1e6, ledger


def greedy(request: Mapping[str, Any]) -> dict[str, int]:
    """What an upstream may bill: every choice, the whole cap."""
    n = request.get("n", 1)
    completion = n * (request.get("max_tokens") or 100_000)
    return {"prompt_tokens": 100 * n, "completion_tokens": completion, "total_tokens": completion}


@pytest.mark.free_lane
async def test_a_credit_lane_never_sends_more_than_its_credits_can_pay_for():
    """A credit lane with $0.001 of credits left admits a request whose worst case is $1.60:
    nothing bounds a request against the credits (there is no reservation), so one request
    overspends them 1,600× — and a provider that bills past free credits bills the card."""
    credits = {
        "free_tier": {"kind": "credits", "budget_usd": 0.001, "reset": "monthly"},
        "models": [{"id": "m", "input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}],
    }
    async with open_sidecar(
        ("cred", "free", ["m"], credits), policy={"free_tier_fallback": "off"}
    ) as (
        url,
        fakes,
    ):
        fakes["cred"].script("m", answer(usage=greedy))
        async with client() as http:
            await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "n": 8, "max_tokens": 100_000},
            )
            lanes_now = (await http.get(f"{url}/lanes")).json()["lanes"]
    left = next(lane for lane in lanes_now if lane["name"] == "cred")["credits_left_usd"]
    assert left >= 0.0, left


PREFILL_PAIR = {
    "models": [
        {"id": m, "input_usd_per_mtok": IN, "output_usd_per_mtok": OUT, "prefill": True}
        for m in ("p1", "p2")
    ]
}


async def test_a_recovered_stream_keeps_the_jobs_paid_attempt_budget():
    """`paid_attempts = 1`: "paid requests per job". A paid stream cut mid-answer is resumed on
    another paid model by a fresh walk with fresh budgets: two paid requests for one job."""
    policy = {"free_tier_fallback": "allow", "paid_attempts": 1}
    aliases = {"pp": ["paid/p1", "paid/p2"]}
    async with open_sidecar(
        ("paid", "paid", ["p1", "p2"], PREFILL_PAIR), policy=policy, aliases=aliases
    ) as (url, fakes):
        fakes["paid"].script("p1", stream_cut(after=3))
        async with client() as http:
            await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "model": "pp", "stream": True},
            )
    assert len(fakes["paid"].requests()) <= 1, [r.model for r in fakes["paid"].requests()]


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
        async with client() as http:
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


def test_the_reservation_covers_a_providers_own_tool_prompt():
    """Anthropic bills a tool-use system prompt it adds itself (346 input tokens for `auto`) on
    any request with tools; a one-tool request is ~60 bytes, so the byte bound reserves ~60 input
    tokens for a bill of ~400. A lane whose provider adds hidden input must reserve it."""
    claude = Candidate(
        lane="anthropic",
        model="claude-haiku-4-5",
        tier="paid",
        input_usd_per_mtok=1.0,
        output_usd_per_mtok=5.0,
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    job = lanes.Job(messages=[{"role": "user", "content": "hi"}], params={"tools": [tool]})
    sent = paid_request(job, cap_param="max_tokens", paid_max_tokens=1)
    billed = ((billed_bytes(sent.body("claude-haiku-4-5")) + 346) * 1.0 + 1 * 5.0) / 1e6
    reserved = worst_case(claude, sent)
    assert isinstance(reserved, float) and reserved >= billed, (reserved, billed)


# == security =====================================================================================


async def test_the_page_can_not_be_framed_by_another_origin():
    """The page is the console (lane switches, approvals): a page of another origin that frames
    it can make the user's click land on a button (clickjacking). It must say `frame-ancestors
    'none'` (or `X-Frame-Options: DENY`)."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, _fakes), client() as http:
        page = await http.get(url.removesuffix("/v1") + "/")
    policy = page.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy and page.headers.get("x-frame-options") == "DENY"


def click_through_a_frame(attacker: str) -> bool:
    """A user with a stock profile (third-party storage allowed) clicks a decoy on `attacker`,
    which frames the sidecar's page invisibly over it. False when the framed page never showed
    its switches (the browser refused to frame it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="lanes-review-"))
    (profile / "Default").mkdir()
    (profile / "Default" / "Preferences").write_text(
        json.dumps({"profile": {"cookie_controls_mode": 0, "block_third_party_cookies": False}})
    )
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=[*FLAGS, "--disable-features=TrackingProtection3pcd"],
        )
        try:
            page = context.new_page()
            page.goto(attacker)
            button = page.frame_locator("iframe").locator("button.switch").first
            try:
                button.wait_for(timeout=5_000)
            except PlaywrightTimeout:
                return False
            box = button.bounding_box()
            assert box is not None
            page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.wait_for_timeout(1500)
            return True
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


async def test_a_framing_page_can_not_switch_a_lane_off(tmp_path):
    """The same, end to end in Chromium: a page on another origin (localhost:other-port) frames
    the console at opacity 0.05 over a decoy; the user's click switches the local lane off —
    under `allow`, every later job then pays."""
    if not await trio.Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    pytest.importorskip("playwright.sync_api")
    async with open_sidecar(("local", "local", ["local-model"]), PAID) as (url, _fakes):
        base = url.removesuffix("/v1")
        await trio.Path(tmp_path / "index.html").write_text(
            "<h1>Click the button to win</h1>"
            f'<iframe src="{base}/" width="1200" height="800" '
            'style="opacity:0.05;position:absolute;top:0;left:0"></iframe>'
        )
        handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            attacker = f"http://localhost:{server.server_address[1]}/index.html"
            clicked = await trio.to_thread.run_sync(click_through_a_frame, attacker)
        finally:
            await trio.to_thread.run_sync(server.shutdown)
            server.server_close()
        async with client() as http:
            lanes_now = (await http.get(f"{url}/lanes")).json()["lanes"]
    assert not clicked and not any(lane["off"] for lane in lanes_now), lanes_now


async def test_a_clients_own_key_does_not_use_up_the_shared_attempt_governor():
    """ "It never counts against the shared quotas": a client calling its bring-your-own-key lane
    uses up the global `attempts_per_minute` governor, and every other client gets 429."""
    byok = ("mine", "free", ["own"], {"byok": True, "free_tier": {"kind": "rate_limited"}})
    policy = {"free_tier_fallback": "off", "attempts_per_minute": 2}
    async with (
        open_sidecar(byok, ("local", "local", ["local-model"]), policy=policy) as (url, _),
        client() as http,
    ):
        own = [
            await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "model": "mine/own"},
                headers={"x-lanes-key-mine": "sk-mine-0123456789abcdef"},
            )
            for _ in range(2)
        ]
        shared = await http.post(
            f"{url}/chat/completions", json={"messages": MESSAGES, "model": "local/local-model"}
        )
    assert [r.headers.get("x-lanes-route") for r in own] == ["byok", "byok"]
    assert shared.status_code == 200, shared.text


# == robustness ===================================================================================


@pytest.mark.parametrize("since", ["9" * 25 + "d", "9" * 400 + "d"])
async def test_a_huge_report_window_is_a_400(since):
    """`GET /v1/report?since=…` with a huge number of days: a 400 naming `since`, not a 500
    (OverflowError in the float product, or in SQLite's integer)."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, _fakes), client() as http:
        response = await http.get(f"{url}/report", params={"since": since})
    assert response.status_code == 400 and openai_shaped(response)


@pytest.mark.parametrize("metadata", ["abc", [1], [[1, 2, 3]]])
async def test_responses_metadata_that_is_no_object_is_a_400_before_anything_is_sent(metadata):
    """`metadata` is echoed in the response; one that is not an object is read by `dict()` only
    after the job was served (and, on a paid lane, billed): the client gets a 500 and retries."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes), client() as http:
        response = await http.post(f"{url}/responses", json={"input": "hi", "metadata": metadata})
    assert response.status_code == 400 and openai_shaped(response)
    assert fakes["local"].requests() == []


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings", "/lanes/local/off"])
async def test_a_malformed_origin_is_refused_cleanly(path):
    """`Origin: http://[::1` (an unclosed IPv6 literal) makes `urlsplit` raise: a 500 and a
    traceback on every job door and every action, instead of a 403."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, _fakes), client() as http:
        response = await http.post(
            f"{url}{path}",
            json={"messages": MESSAGES, "model": "local-model", "input": "x"},
            headers={"origin": "http://[::1"},
        )
    assert response.status_code == 403 and openai_shaped(response)


@pytest.mark.parametrize("role", [{"x": 1}, ["user"]])
async def test_a_responses_input_role_that_is_no_string_is_a_400(role):
    """`input[0].role` an object or an array: `_ROLES.get(role)` raises TypeError (unhashable),
    a 500, where every other wrong type is a 400 naming the field."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, _fakes), client() as http:
        response = await http.post(
            f"{url}/responses",
            json={"input": [{"type": "message", "role": role, "content": "hi"}]},
        )
    assert response.status_code == 400 and openai_shaped(response)


@pytest.mark.parametrize("door", ["/v1/messages", "/v1/responses"])
async def test_an_upstream_finish_reason_that_is_no_string_is_not_a_500(door):
    """A 200 completion whose `finish_reason` is a list passes `check_completion`; the Messages
    and Responses translations look it up in a dict (TypeError): the job was served — and, if
    paid, billed — and the client gets a bare 500 and a traceback in the log."""
    completion = {
        "id": "x",
        "object": "chat.completion",
        "model": "b",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": [1]}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    async with open_sidecar(("odd", "local", ["b"])) as (url, fakes):
        fakes["odd"].script("b", raw(200, json.dumps(completion).encode()))
        async with client() as http:
            body: dict[str, Any] = (
                {"model": "odd/b", "max_tokens": 5, "messages": MESSAGES}
                if door == "/v1/messages"
                else {"model": "odd/b", "input": "hi"}
            )
            response = await http.post(url.removesuffix("/v1") + door, json=body)
    assert response.status_code != 500, response.text
    assert response.headers["content-type"].startswith("application/json")


def read_the_console(base: str) -> str:
    """Open the page, enter the admin key, and read its summary line."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(base + "/")
            page.fill("#admin-key", ADMIN_KEY)
            page.click("#admin-save")
            page.wait_for_function(
                "document.getElementById('summary').textContent !== 'loading…'", timeout=10_000
            )
            page.wait_for_timeout(1_500)  # a refresh after the key was entered
            return page.locator("#summary").inner_text()
        finally:
            browser.close()


async def test_the_console_works_when_client_keys_are_configured():
    """With `[server.clients]` set, the page reads `/v1/lanes` and `/v1/approvals` without a key:
    both answer 401 and the page says "sidecar unreachable" — no lanes, no approvals, nothing to
    click — even after the admin key is entered."""
    if not await trio.Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    pytest.importorskip("playwright.sync_api")
    server = {"clients": {"alice": "CLIENT_KEY"}, "admin_key_env": "ADMIN_KEY"}
    async with open_sidecar(
        ("local", "local", ["local-model"]), server=server, env={"ADMIN_KEY": ADMIN_KEY}
    ) as (url, _fakes):
        summary = await trio.to_thread.run_sync(read_the_console, url.removesuffix("/v1"))
    assert "free lane" in summary


# == cosmetic =====================================================================================


async def test_a_responses_cap_out_of_range_names_the_clients_field():
    """`max_output_tokens` above 10^8 on `/v1/responses`: the 400 names `max_tokens` (the
    translation's field), which the client never sent."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, _fakes), client() as http:
        response = await http.post(
            f"{url}/responses", json={"input": "hi", "max_output_tokens": 10**9}
        )
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_output_tokens"


# == what held (guards, not findings) =============================================================


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
        client() as http,
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


async def test_a_paid_stream_that_never_ends_is_cut_at_the_deadline_and_kept_in_full():
    """Held: a paid upstream streaming for ever ends at the job's deadline with an in-band error
    (never `[DONE]`), and the ledger keeps the whole reservation."""
    async with open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes):
        fakes["paid"].script("paid-model", answer(text="word " * 100_000, chunk_delay_s=0.001))
        async with client() as http:
            streamed = await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "stream": True},
                headers={"x-lanes-deadline-ms": "1000"},
            )
            ledger = await spent(http, url)
    candidate = Candidate(
        lane="paid", model="paid-model", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT
    )
    reserved = worst_case(
        candidate,
        paid_request(lanes.Job(messages=MESSAGES), cap_param="max_tokens", paid_max_tokens=4096),
    )
    assert "stream_interrupted" in streamed.text and "[DONE]" not in streamed.text
    assert isinstance(reserved, float) and ledger == pytest.approx(reserved)
