"""The money path's invariants: no paid request without consent; the ledger never below what an
upstream could bill; nothing a client or an upstream sends can raise the ceiling."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import lanes
from helpers import config, free_lane, paid_lane
from lanes._core.model.candidates import Candidate
from lanes._core.policy.spend import Unbounded, billed_bytes, paid_request, worst_case
from lanes.testing import answer, open_fake, rate_limited

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
IN, OUT = 1.0, 2.0  # the paid fake's prices, USD per million tokens (see helpers.paid_lane)


def paid_candidate(**extra: Any) -> Candidate:
    """The paid fake's model `m` on lane `p`, at its prices, with `extra` fields."""
    return Candidate(
        lane="p", model="m", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT, **extra
    )


def readable_bytes(value: Any) -> int:
    """Every string and number an upstream could read, as UTF-8 bytes — written apart from the
    code under test: the most input tokens any tokenizer can make of the request."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int | float):
        return len(repr(value))
    if isinstance(value, dict):
        return sum(readable_bytes(k) + readable_bytes(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(readable_bytes(v) for v in value)
    return 0


def greedy(honours: str = "max_tokens"):
    """An upstream that bills the most it may: a token per byte it reads, per choice, and the whole
    output cap it honours per choice (100k tokens when it sees none)."""

    def usage(request: dict[str, Any]) -> dict[str, int]:
        readable = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
        n = request.get("n", 1) if isinstance(request.get("n"), int) else 1
        cap = request.get(honours)
        cap = cap if isinstance(cap, int) and cap > 0 else 100_000
        prompt, completion = n * readable_bytes(readable), n * cap
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    return usage


def billed(request: dict[str, Any], honours: str = "max_tokens") -> float:
    usage = greedy(honours)(request)
    return (usage["prompt_tokens"] * IN + usage["completion_tokens"] * OUT) / 1e6


# -- the reservation is a true worst case (pure) ------------------------------------------------

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=60)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
image = st.fixed_dictionaries(
    {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": text})}
)
content = text | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}) | image, min_size=1, max_size=3
)
requests = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": content}),
            min_size=1,
            max_size=3,
        )
    },
    optional={
        "n": st.integers(1, 16),
        "max_tokens": st.integers(-5, 5000),
        "max_completion_tokens": st.integers(-5, 5000),
        "tools": st.lists(json_values, max_size=3),
        "functions": st.lists(json_values, max_size=3),
        "response_format": json_values,
        "temperature": st.floats(0, 2),
    },
)


@given(
    request=requests,
    dialect=st.sampled_from(["max_tokens", "max_completion_tokens"]),
    image_usd=st.none() | st.floats(0, 0.01),
    paid_max=st.integers(1, 8192),
)
def test_the_reservation_covers_any_bill(request, dialect, image_usd, paid_max):
    """For any request, the reservation of the request as sent is at least what an upstream that
    honours the sent cap could bill for it; images without a price are refused, never guessed."""
    candidate = paid_candidate(cap_param=dialect, image_usd=image_usd)
    job = lanes.Job(
        messages=request["messages"], params={k: v for k, v in request.items() if k != "messages"}
    )
    sent = paid_request(job, cap_param=dialect, paid_max_tokens=paid_max)
    body = sent.body("m")
    other = "max_completion_tokens" if dialect == "max_tokens" else "max_tokens"
    asked = [v for k in ("max_tokens", "max_completion_tokens") if (v := request.get(k, 0)) > 0]
    assert other not in body and body[dialect] == min([paid_max, *asked])  # one cap, never raised
    images = sum(
        1
        for m in request["messages"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image_url"
    )
    reservation = worst_case(candidate, sent)
    if images and image_usd is None:
        assert isinstance(reservation, Unbounded)
        return
    hosted = [  # a hosted tool (a search) bills per use: refused, never priced by its bytes
        t
        for t in request.get("tools", [])
        if isinstance(t, dict) and t.get("type", "function") not in ("function", "custom")
    ]
    if hosted:
        assert isinstance(reservation, Unbounded) and "'tools'" in str(reservation)
        return
    assert not isinstance(reservation, Unbounded)
    n = request.get("n", 1)
    assert reservation >= billed(body, dialect) + n * images * (image_usd or 0.0) - 1e-12


@given(st.one_of(st.text(min_size=1), st.lists(st.text(min_size=1), min_size=1, max_size=8)))
def test_an_embeddings_reservation_is_its_whole_body_at_the_input_price(value):
    """An embedding has no output: its worst case is every byte it sends, at the input price —
    at least its input tokens, however they are counted; no output price is needed."""
    emb = Candidate(lane="p", model="e", tier="paid", input_usd_per_mtok=IN, embedding=True)
    job = lanes.Job(input=value, params={"encoding_format": "float"})
    body = job.body("e")
    reserved = worst_case(emb, job)
    assert reserved == pytest.approx(billed_bytes(body) * IN / 1e6)
    assert billed_bytes(body) >= len(json.dumps(value, ensure_ascii=False).encode()) - 2


def test_unbounded_requests_are_named():
    """Audio input, a silly `n` and unknown prices are refused for paid with the reason."""
    paid = Candidate(
        lane="p", model="m", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT
    )
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]
    cases = {
        "input_audio input has no bounded price": lanes.Job(messages=audio),
        "n must be a whole number from 1 to 128 (got 1000)": lanes.Job(
            messages=MESSAGES, params={"n": 1000}
        ),
        "n must be a whole number from 1 to 128 (got 'ten')": lanes.Job(
            messages=MESSAGES, params={"n": "ten"}
        ),
    }
    for reason, job in cases.items():
        assert (
            str(worst_case(paid, paid_request(job, cap_param="max_tokens", paid_max_tokens=9)))
            == reason
        )
    # an explicit null is the provider's default, one choice: quoted (its bytes counted), not
    # refused, and below two choices
    one, null, two = (
        worst_case(paid, paid_request(job, cap_param="max_tokens", paid_max_tokens=9))
        for job in (
            lanes.Job(messages=MESSAGES, params={"n": 1}),
            lanes.Job(messages=MESSAGES, params={"n": None}),
            lanes.Job(messages=MESSAGES, params={"n": 2}),
        )
    )
    assert isinstance(null, float) and isinstance(one, float) and isinstance(two, float)
    assert one <= null < two
    unpriced = Candidate(lane="p", model="m", tier="paid")
    assert str(worst_case(unpriced, lanes.Job(messages=MESSAGES))) == "p/m has no known price"


# -- an approval is for one request, at one worst case (pure) -----------------------------------

few = st.sampled_from(["a", "b"])
small_chats = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": few}), min_size=1, max_size=2
        )
    },
    optional={"n": st.integers(1, 2), "max_tokens": st.integers(1, 2), "tools": st.lists(few)},
)
small_jobs = st.builds(
    lambda model, chat, embedded, embedding: (
        lanes.Job(model=model, input=embedded, params={"dimensions": chat.get("n", 1)})
        if embedding
        else lanes.Job(
            model=model,
            messages=chat["messages"],
            params={k: v for k, v in chat.items() if k != "messages"},
        )
    ),
    st.sampled_from(["auto", "p/m"]),
    small_chats,
    st.sampled_from(["a", "b", ["a"], ["a", "b"], [1, 2]]),
    st.booleans(),
)


@given(small_jobs, small_jobs)
def test_a_request_fingerprint_covers_everything_that_prices_the_request(one, other):
    """Two requests share a fingerprint (so one "approve once" could pay for either) exactly when
    they ask the same model for the same body — messages or embedding input, and every parameter —
    so they also share their worst case on every candidate."""
    same = one.request_fingerprint() == other.request_fingerprint()
    assert same == (one.model == other.model and one.body("m") == other.body("m"))
    if same:
        for candidate in (
            Candidate(lane="p", model="m", tier="paid", input_usd_per_mtok=IN, embedding=True),
            Candidate(
                lane="p", model="m", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT
            ),
        ):
            sent = [
                paid_request(j, cap_param="max_tokens", paid_max_tokens=9) for j in (one, other)
            ]
            assert worst_case(candidate, sent[0]) == worst_case(candidate, sent[1])


# -- 0 overshoot against an upstream that bills the most it may --------------------------------

BIG = [
    {"name": f"f{i}", "description": "x" * 1000, "parameters": {"type": "object"}}
    for i in range(100)
]
SHAPES: dict[str, tuple[dict[str, Any], float]] = {  # (params, ceiling): crossed if under-counted
    "n=10": ({"n": 10}, 0.05),
    "max_completion_tokens=10 to a max_tokens upstream": ({"max_completion_tokens": 10}, 0.001),
    "100 KB of legacy functions": ({"functions": BIG}, 0.5),
    "100 KB of tools": ({"tools": [{"type": "function", "function": f} for f in BIG]}, 0.5),
    "no cap at all": ({}, 0.01),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_no_overshoot_whatever_the_request(shape, env, autojump_clock):
    """200 concurrent paid jobs of one shape against a greedy upstream: what it bills stays under
    the ceiling, and the ledger holds at least what it billed."""
    params, ceiling = SHAPES[shape]
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(delay_s=0.5, usage=greedy()))
        cfg = config(
            paid_lane("paid", paid.base_url),
            policy={
                "free_tier_fallback": "allow",
                "paid_ceiling_usd_per_day": ceiling,
                "paid_max_tokens": 50,
            },
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            results: list[bool] = []

            async def one() -> None:
                try:
                    await d.complete(
                        lanes.Job(
                            messages=MESSAGES, model="paid/paid-model", params=params, deadline_s=30
                        )
                    )
                    results.append(True)
                except lanes.PaidBudgetExhausted:
                    results.append(False)

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one)
            spent = d.paid_spent_today()
    bills = [billed(dict(r.body)) for r in paid.requests()]
    assert len(results) == 200 and 0 < sum(results) < 200 and len(bills) == sum(results)
    assert sum(bills) <= ceiling + 1e-12  # the upstream's invoice stays under the ceiling
    assert spent >= sum(bills) - 1e-12  # and the ledger is never below it


async def test_the_cap_goes_where_the_lane_reads_it(env, autojump_clock):
    """A lane whose upstream honours only `max_completion_tokens` is sent the client's
    `max_tokens` there (and nothing in `max_tokens`), so it can not run past the reservation."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(usage=greedy("max_completion_tokens")))
        cfg = config(paid_lane("paid", paid.base_url, output_cap="max_completion_tokens"))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            reply = await d.complete(
                lanes.Job(messages=MESSAGES, model="paid/paid-model", params={"max_tokens": 7})
            )
    body = paid.requests()[0].body
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert reply.cost_usd == pytest.approx(billed(dict(body), "max_completion_tokens"))


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -(10**9), "completion_tokens": -(10**9), "total_tokens": -2 * 10**9},
        {"prompt_tokens": "12", "completion_tokens": "3"},
        {"prompt_tokens": 2**64, "completion_tokens": 1},
        {"prompt_tokens": 1e300, "completion_tokens": 1},
        {"total_tokens": 15},
        {},
        {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 2**64},
        {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 1e300},
        {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 5},
    ],
    ids=[
        "negative",
        "strings",
        "2**64",
        "1e300",
        "total only",
        "missing",
        "total 2**64",
        "total 1e300",
        "total below its parts",
    ],
)
async def test_garbage_usage_settles_at_the_reservation(usage, env, autojump_clock):
    """Usage that is not sane, or whose total does not add up, never lowers the ledger: the attempt
    settles at its full reservation, and what the reply, the audit and the ledger say agree."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(usage=usage))
        async with lanes.open_dispatcher(config(paid_lane("paid", paid.base_url)), env=env) as d:
            reply = await d.complete(
                lanes.Job(messages=MESSAGES, model="paid/paid-model", params={"max_tokens": 100})
            )
            spent = d.paid_spent_today()
            recent = d.statistics().recent[0]
    sent = dict(paid.requests()[0].body)
    reservation = (billed_bytes(sent) * IN + 100 * OUT) / 1e6
    assert spent == pytest.approx(reservation) and reply.cost_usd == pytest.approx(reservation)
    assert recent["cost_usd"] == pytest.approx(reservation) and spent > 0


async def test_a_lost_answer_stays_counted_in_full(env, autojump_clock):
    """A paid request whose answer was lost (the connection reset mid-way) may have been billed: its
    reservation stands; the client's retry reserves again. The ledger covers both bills."""
    from lanes.testing import reset

    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", reset(), answer(usage=greedy()))
        async with lanes.open_dispatcher(config(paid_lane("paid", paid.base_url)), env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable):
                await d.complete(lanes.Job(messages=MESSAGES, model="paid/paid-model"))
            await d.complete(lanes.Job(messages=MESSAGES, model="paid/paid-model"))
            spent = d.paid_spent_today()
    bills = [billed(dict(r.body)) for r in paid.requests()]
    assert len(bills) == 2 and spent >= sum(bills) - 1e-12


# -- honest stream billing ------------------------------------------------------------------------


@pytest.mark.parametrize("client_asks", [False, True])
async def test_a_paid_stream_is_billed_from_its_usage(client_asks, env, autojump_clock):
    """A paid stream asks its upstream for usage whether or not the client did, settles from it
    (not at the worst case), and passes the usage chunk on only when the client asked."""
    params = {"stream_options": {"include_usage": True}} if client_asks else {}
    job = lanes.Job(messages=MESSAGES, model="paid/paid-model", params=params)
    async with (
        open_fake("paid", models=("paid-model",)) as paid,
        lanes.open_dispatcher(config(paid_lane("paid", paid.base_url)), env=env) as d,
    ):
        async with d.open_stream(job) as stream:
            chunks = [c async for c in stream]
        spent, trailer_cost = d.paid_spent_today(), stream.cost_usd
    sent = paid.requests()[0].body
    assert sent["stream_options"] == {"include_usage": True}
    usage = next(c["usage"] for c in [*chunks, {"usage": stream.usage}] if c.get("usage"))
    true_cost = (usage["prompt_tokens"] * IN + usage["completion_tokens"] * OUT) / 1e6
    assert spent == pytest.approx(true_cost, rel=0.05) and trailer_cost == pytest.approx(spent)
    assert any(not c.get("choices") and c.get("usage") for c in chunks) is client_asks


# -- paid is never held back by a free quota; `free` is honoured for every kind -------------------


@pytest.mark.free_lane
async def test_a_free_quota_used_up_does_not_hold_back_the_lanes_paid_models(env, autojump_clock):
    """On an OpenRouter-like lane whose `:free` models share an account-wide quota, that quota
    running out backs off the free models only: a job naming the lane's paid model is served."""
    async with open_fake("mixed", models=("a:free", "paid-one")) as mixed:
        mixed.script("a:free", rate_limited(retry_after=600))
        lane = {
            "name": "mixed",
            "module": "openai_compatible",
            "base_url": mixed.base_url,
            "api_key_env": "PAID_API_KEY",
            "free_tier": {"kind": "free_models", "account_wide": True},
            "models": [
                {"id": "a:free"},
                {"id": "paid-one", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0},
            ],
        }
        async with lanes.open_dispatcher(config(lane), env=env) as d:
            with pytest.raises(lanes.FreeTierExhausted):
                await d.complete(lanes.Job(messages=MESSAGES, model="mixed/a:free"))
            reply = await d.complete(lanes.Job(messages=MESSAGES, model="mixed/paid-one"))
    assert (reply.model, len(reply.attempts)) == ("paid-one", 1)


@pytest.mark.free_lane
async def test_the_free_flag_is_honoured_for_every_kind(env, autojump_clock):
    """`free = true` on a model of a `none` lane makes it borrowed-free; `free = false` on a
    rate-limited lane's model makes it paid."""
    async with open_fake("x", models=("gift", "pricey")) as x:
        lanes_ = [
            {
                "name": "none",
                "module": "openai_compatible",
                "base_url": x.base_url,
                "api_key_env": "",
                "free_tier": {"kind": "none"},
                "models": [{"id": "gift", "free": True}],
            },
            free_lane("rl", x.base_url, models=["pricey"]),
        ]
        lanes_[1]["models"] = [
            {"id": "pricey", "free": False, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}
        ]
        async with lanes.open_dispatcher(config(*lanes_), env=env) as d:
            tiers = {c.key: c.tier for c in d.candidates()}
            reply = await d.complete(lanes.Job(messages=MESSAGES, model="none/gift"))
    assert tiers == {"none/gift": "free", "rl/pricey": "paid"}
    assert (reply.route, reply.cost_usd) == ("primary", 0.0)


def test_usage_for_the_greedy_fake_is_sane():
    """The test's own greedy upstream bills whole tokens, so lanes believes it (not garbage)."""
    usage = greedy()({"messages": MESSAGES, "max_tokens": 5, "n": 2})
    assert usage["completion_tokens"] == 10 and json.dumps(usage)
