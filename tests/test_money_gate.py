"""The money path in one place: each candidate's quote is worked out once per job, and the paid
gate never reserves without consent, never holds past the ceiling, and never settles below a
bill."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from typing import Any, Literal

import attrs
import pytest
import trio
from conftest import FREE_LANE_OFF
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import lanes
from helpers import config, examples, free_lane, paid_lane
from lanes._core.freetier.kinds import NoFreeTier
from lanes._core.freetier.manager import FreeTierManager, LaneTerms
from lanes._core.freetier.prices import cost_usd
from lanes._core.freetier.windows import window_id
from lanes._core.model.candidates import Candidate, Outcome
from lanes._core.model.clocks import TrioTime
from lanes._core.model.errors import FallbackDenied, FallbackNeedsApproval, PaidBudgetExhausted
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord
from lanes._core.money.approvals import PendingApprovals
from lanes._core.money.consent import Consent
from lanes._core.money.ledger import Ledger
from lanes._core.money.paid import Hold, PaidGate
from lanes._core.money.quote import Quote, quote
from lanes._core.policy import spend
from lanes._core.policy.policy import FallbackMode, PolicyConfig
from lanes._core.runtime.wall import Wall
from lanes._core.state.clock import StoreClock
from lanes._core.state.store import SQLiteStore
from lanes.testing import answer, open_fake, rate_limited, status

MESSAGES = [{"role": "user", "content": "What does this cost?"}]


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> Counter[str]:
    """Count calls of `spend.<name>` by candidate key, wherever lanes imported it."""
    original = getattr(spend, name)
    counts: Counter[str] = Counter()

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = [a for a in (*args, *kwargs.values()) if isinstance(a, Candidate)]
        counts[found[0].key] += 1
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("lanes") and (
            getattr(module, name, None) is original
        ):
            monkeypatch.setattr(module, name, counted)
    return counts


async def test_a_paid_job_works_out_each_candidates_worst_case_once(
    monkeypatch, env, autojump_clock
):
    """Through the dispatcher, a job whose free candidate faults then is rate-limited and whose
    first paid one faults then answers (retries on both) computes the request as sent once per
    candidate tried, and the worst case once per paid candidate tried — the gate's and the
    attempt's are one."""
    as_sent, worst = count_calls(monkeypatch, "as_sent"), count_calls(monkeypatch, "worst_case")
    async with (
        open_fake("wall", models=("sick",)) as wall,
        open_fake("c", models=("p1", "p2")) as c,
    ):
        wall.script("sick", status(503), rate_limited(retry_after=600))
        c.script("p1", status(503), answer())
        cfg = config(
            free_lane("wall", wall.base_url, models=["sick"]),
            paid_lane("c", c.base_url, models=["p1", "p2"]),
            aliases={"trio": ["wall/sick", "c/p1", "c/p2"]},
            policy={
                "free_tier_fallback": "allow",
                "paid_ceiling_usd_per_day": 100.0,
                "paid_attempts": 2,
                "transient_retries": 2,
                "max_attempts": 6,
            },
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            reply = await d.complete(lanes.Job(messages=MESSAGES, model="trio"))
    tried = Counter(a.key for a in reply.attempts)
    free = {} if FREE_LANE_OFF else {"wall/sick": 2}  # FREE_LANE=off: the free lane is off
    assert reply.lane == "c" and tried == {**free, "c/p1": 2}  # each retried
    assert as_sent == {key: 1 for key in tried}
    assert worst == {"c/p1": 1}
    assert reply.cost_usd > 0


# -- the paid gate, as a property over sequences of quotes, consents and settlements ------------

IN, OUT = 1.0, 8.0  # USD per million tokens
CEILING = 0.05
PAID = Candidate(lane="p", model="m", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT)
#: What a person does about a paid request: nothing, approve it once, deny it, grant its client
#: paid fallback beforehand; or the job names this paid model (that is consent).
PEOPLE = ("nothing", "once", "deny", "grant", "pinned")
#: How an attempt ends: (outcome, status, category, usage kind); what its upstream could bill is
#: the usage it reports, when sane; nothing for a refusal or a request that never left; else (a
#: 5xx, usage not to be believed) as much as the request as sent allows: its worst case.
ENDS: dict[str, tuple[Outcome, int | None, str, str | None]] = {
    "ok": ("ok", 200, "", "sane"),
    "ok_garbage": ("ok", 200, "", "garbage"),
    "refused": ("rate_limited", 429, "", None),
    "bad_request": ("final", 400, "", None),
    "gateway": ("fault", 503, "", None),
    "never_connected": ("fault", None, "connect", None),
    "cut": ("deadline", None, "", None),
}

pay = st.fixed_dictionaries(
    {
        "op": st.just("pay"),
        "fallback": st.sampled_from(["off", "ask", "allow"]),
        "person": st.sampled_from(PEOPLE),
        "chars": st.integers(1, 3000),
        "max_tokens": st.integers(1, 6000) | st.none(),
        "n": st.sampled_from([1, 1, 1, 2, 1000]),  # 1000: a worst case with no bound
        "client": st.sampled_from(["alice", "bob"]),
        "free_only": st.sampled_from([False, False, True]),  # a batch item: work that can wait
        # a batch item past its free window, on what is left of its batch's budget
        "paid_cap": st.none() | st.none() | st.sampled_from([0.0, 1e-6, 0.0005, 0.01, 1.0]),
    }
)
settle = st.fixed_dictionaries(
    {
        "op": st.just("settle"),
        "which": st.integers(0, 50),
        "end": st.sampled_from([*ENDS, "never_sent"]),
        "fraction": st.floats(0.0, 1.0),
    }
)


class Bench:
    """A paid gate over a real ledger in a SQLite store, on a wall derived from trio's clock."""

    def __init__(self, store: SQLiteStore, policy: PolicyConfig) -> None:
        self.store = store
        self.wall = Wall(base=1_800_000_000.0, simulated=True)  # 08:00 UTC: no midnight in a run
        clock = StoreClock(self.wall, tolerance_s=120.0, kind="sqlite", where=":memory:")
        self.policy = policy  # the policy in force: each payment sets its consent mode
        self.ledger = Ledger(lambda: self.policy, FreeTierManager(), store, self.wall, clock)
        self.approvals = PendingApprovals(store, self.wall, once_ttl_s=policy.once_ttl_s)
        self.consent = Consent(lambda: self.policy, self.approvals, lambda job: None)
        manager = FreeTierManager()
        manager.register(PAID.lane, LaneTerms(kind=NoFreeTier()))
        self.gate = PaidGate(self.ledger, self.consent, manager, self.wall, lambda: self.policy)
        self.granted: set[str] = set()  # clients granted paid fallback (for an hour: the run)

    def rows(self) -> dict[str, float]:
        """Every reservation in the store, and what it counts now (settled, else reserved)."""
        sql = "SELECT id, COALESCE(settled, reserved) FROM paid_ledger"
        return dict(self.store.records.query(sql))

    def spent(self) -> float:
        return self.store.paid_spent(window_id("day", self.wall()))

    async def pay(
        self, record: JobRecord, q: Quote, fallback: FallbackMode, person: str
    ) -> Hold | None:
        """Ask the gate's consent for `q` under `free_tier_fallback = fallback` (`person` decides
        when it asks), then its hold: the hold when it holds money, else None — and (a) nothing
        reserved without consent."""
        client = record.job.client
        if person == "grant":
            self.store.put_grant(client, self.wall() + 3600.0, self.wall())
            self.granted.add(client)
        self.policy = attrs.evolve(self.policy, free_tier_fallback=fallback)
        permit = None
        async with trio.open_nursery() as nursery:
            if person == "once" or person == "deny":
                nursery.start_soon(self.decide, "once" if person == "once" else "deny")
            with contextlib.suppress(FallbackNeedsApproval, FallbackDenied):
                pinned = person == "pinned"
                permit = await self.gate.may_pay(record, q, pinned=pinned, lane_min_s=0.0)
            nursery.cancel_scope.cancel()
        before = self.rows()
        try:
            hold = await self.gate.hold(record, q, permit, shared=True)
        except PaidBudgetExhausted:
            hold = None
        if permit is None:
            assert isinstance(hold, str) and self.rows() == before
            return None
        consented = person == "pinned" or fallback == "allow"
        consented |= fallback == "ask" and (client in self.granted or person == "once")
        assert consented and not record.job.free_only, (fallback, person)
        cap = record.job.paid_cap_usd  # a batch pays only under allow, within its budget left
        worst = q.worst_usd
        assert cap is None or (fallback == "allow" and isinstance(worst, float) and worst <= cap)
        if not isinstance(hold, Hold):
            assert self.rows() == before
            return None
        assert hold.reservation is not None and set(self.rows()) - set(before) == {
            hold.reservation.id
        }
        return hold

    async def decide(self, decision: Literal["once", "deny"]) -> None:
        while not self.approvals.pending():  # noqa: ASYNC110 - an approval opens no event
            await trio.sleep(0.1)
        await self.approvals.decide(self.approvals.pending()[0].id, decision)

    def settle(self, hold: Hold, end: str, fraction: float) -> float:
        """End `hold`'s attempt so; return the most its upstream could bill."""
        q, worst = hold.quote, hold.quote.worst_usd
        assert isinstance(worst, float)
        if end == "never_sent":
            self.gate.release(hold)
            return 0.0
        outcome, code, category, kind = ENDS[end]
        usage: Any = usage_within(q, fraction) if kind == "sane" else None
        if kind == "garbage":
            usage = {"prompt_tokens": -5, "completion_tokens": "many"}
        cost = self.gate.settle(
            hold, outcome, status=code, category=category, usage=usage, spend_credits=True
        )
        assert hold.reservation is not None
        assert cost == self.rows()[hold.reservation.id]  # what the attempt records is the ledger's
        if kind == "sane":
            return cost_usd(usage["prompt_tokens"], usage["completion_tokens"], IN, OUT)
        if code in (400, 429) or category == "connect":
            return 0.0
        return worst


def usage_within(q: Quote, fraction: float) -> dict[str, int]:
    """Usage an upstream honouring the sent cap may report: a share of the bytes it read and of
    the output cap, per choice."""
    body = q.job.body(q.candidate.model)
    n = body.get("n", 1)
    prompt = int(fraction * spend.billed_bytes(body)) * n
    completion = int(fraction * body[q.candidate.cap_param]) * n
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def job_of(op: dict[str, Any]) -> Job:
    """The chat job a `pay` step asks for."""
    params: dict[str, Any] = {"n": op["n"]}
    if op["max_tokens"] is not None:
        params["max_tokens"] = op["max_tokens"]
    content = "x" * op["chars"]
    return Job(
        messages=[{"role": "user", "content": content}],
        params=params,
        client=op["client"],
        free_only=op["free_only"],
        paid_cap_usd=op["paid_cap"],
    )


@settings(max_examples=examples(60), deadline=None)
@given(ops=st.lists(pay | settle, min_size=1, max_size=30))
def test_the_paid_gate_holds_the_money_invariants(ops):
    """For any sequence of paid quotes under any consent, and settlements of any kind: (a) nothing
    is reserved without consent — and for a batch item (`free_only`), nothing whatever the
    consent, a grant, an approval or a pinned paid model says — (b) what is spent and held never
    exceeds the ceiling, (c) after settling, the ledger keeps at least what the upstream could
    bill."""
    policy = PolicyConfig(free_tier_fallback="ask", paid_ceiling_usd_per_day=CEILING)
    store = SQLiteStore(":memory:")
    live: list[Hold] = []

    async def run() -> None:
        bench = Bench(store, policy)
        for op in ops:
            if op["op"] == "pay":
                job, now = job_of(op), TrioTime(trio.current_time())
                record = JobRecord(job, deadline_at=TrioTime(now + 5.0), started_at=now)
                q = quote(PAID, job, policy)
                hold = await bench.pay(record, q, op["fallback"], op["person"])
                if hold is not None:
                    live.append(hold)
            elif live:
                hold = live.pop(op["which"] % len(live))
                bill = bench.settle(hold, op["end"], op["fraction"])
                assert hold.reservation is not None
                assert bench.rows()[hold.reservation.id] >= bill - 1e-12  # (c)
            assert bench.spent() <= CEILING + 1e-12  # (b) spent and held, as the ledger counts
            assert sum(bench.rows().values()) <= CEILING + 1e-12

    try:
        trio.run(run, clock=MockClock(autojump_threshold=0))
    finally:
        store.close()
