"""The batch day's bound: what lanes' headroom rule lets a batch start, two upper bounds on the
items any schedule could serve under it (a max-flow and a mixed-integer program), and the oracle's
schedule below them."""

from __future__ import annotations

import functools
import itertools

import httpx2
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.batchbound import allowed, bound, caps, obeyed, replay
from bench.batchexact import tight_upper
from helpers import examples
from lanes.testing import open_fake, quota


def test_the_rule_lets_a_batch_start_all_but_the_whole_requests_kept():
    """At 0.2 a batch starts 8 of 10, 6 of 8 (1.6 kept rounds up), and all of an unknown day."""
    assert [allowed(n, 0.2) for n in (10, 5, 20, 8, 30, 1500)] == [8, 4, 16, 6, 24, 1200]
    assert caps(0.2)["p-unconfigured"] == (8, 800, 6, 800)
    assert caps(0.0)["p-headers"] == (10, 1500, 10, 1500)


@settings(max_examples=examples(60))
@given(st.integers(1, 2000), st.floats(0.0, 0.9))
def test_the_rule_keeps_at_least_the_headroom(limit, headroom):
    """The rule keeps at least the headroom's share of a quota, and less than a request more."""
    left = limit - allowed(limit, headroom)
    assert limit * headroom - 1e-6 <= left < limit * headroom + 1


Limits = dict[str, tuple[int, int, int, int]]


def brute_force(limits: Limits, arrivals: list[int], items: int) -> int:
    """The most batch items over every schedule of starts at each minute's reset (at most r a
    provider, only while the day's use is below d) and every placement of the interactive jobs
    (any provider with room in its minute and day; the paid lane only when none has)."""
    quotas = list(limits.values())

    @functools.cache
    def best(minute: int, used: tuple[int, ...], left: int) -> int:
        if minute == len(arrivals):
            return 0
        found = 0
        starts = [
            range(min(r, left, d - u, rpd - u) + 1) if u < d else range(1)
            for (_, rpd, r, d), u in zip(quotas, used, strict=True)
        ]
        for b in itertools.product(*starts):
            if sum(b) > left:
                continue
            after = [u + n for u, n in zip(used, b, strict=True)]
            rooms = [
                min(rpm - n, rpd - u)
                for (rpm, rpd, _, _), u, n in zip(quotas, after, b, strict=True)
            ]
            for x in itertools.product(*(range(room + 1) for room in rooms)):
                if sum(x) > arrivals[minute]:
                    continue
                if sum(x) < arrivals[minute] and x != tuple(rooms):
                    continue  # a job went to the paid lane while a free quota had room
                then = tuple(u + n for u, n in zip(after, x, strict=True))
                found = max(found, sum(b) + best(minute + 1, then, left - sum(b)))
        return found

    return best(0, tuple(0 for _ in quotas), items)


@settings(max_examples=examples(100))
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 7), st.floats(0.0, 0.9), st.booleans()),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.integers(0, 5), min_size=1, max_size=5),
    st.one_of(st.integers(0, 12), st.just(100)),  # 100: more items than the rule lets through
)
def test_the_best_schedule_lies_between_the_oracle_and_the_bound(providers, arrivals, items):
    """No schedule serves more than the upper bound; the oracle's schedule is one of them."""
    limits = {
        f"p{i}": (rpm, rpd, allowed(rpm, h), allowed(rpd, h) if known else rpd)
        for i, (rpm, rpd, h, known) in enumerate(providers)
    }
    found = bound(dict(enumerate(arrivals)), items=items, minutes=len(arrivals), limits=limits)
    assert found.served <= brute_force(limits, arrivals, items) <= found.upper


def test_the_oracle_by_hand():
    """An interactive job before the batch is done costs it an item; one after costs nothing."""
    limits = {"a": (10, 100, 8, 80), "b": (5, 50, 4, 40)}
    alone = bound({}, items=10**6, minutes=1440, limits=limits)
    assert alone.served == alone.upper == 120 and alone.finish_s == 9 * 60  # both in 10 minutes
    assert bound({}, items=24, minutes=1440, limits=limits).finish_s == 60.0  # 12 a minute
    early = bound({0: 3}, items=10**6, minutes=1440, limits=limits)
    assert early.served == early.upper == 117  # 3 in the minute's headroom, before either is done
    late = bound({30: 20}, items=10**6, minutes=1440, limits=limits)
    assert late.served == late.upper == 120  # both done: the 20 use the day's headroom


PROVIDERS = st.lists(
    st.tuples(st.integers(1, 3), st.integers(1, 7), st.floats(0.0, 0.9), st.booleans()),
    min_size=1,
    max_size=3,
)


@settings(max_examples=examples(100))
@given(
    PROVIDERS,
    st.lists(st.integers(0, 5), min_size=1, max_size=5),
    st.one_of(st.integers(0, 12), st.just(100)),
    st.data(),
)
def test_no_schedule_serves_more_than_the_program_allows(providers, arrivals, items, data):
    """The program's bound holds over every schedule, with free-first routing modelled for
    every minute or only the first few (the rest relaxed)."""
    limits = {
        f"p{i}": (rpm, rpd, allowed(rpm, h), allowed(rpd, h) if known else rpd)
        for i, (rpm, rpd, h, known) in enumerate(providers)
    }
    horizon = data.draw(st.integers(0, len(arrivals)))
    tight = tight_upper(
        dict(enumerate(arrivals)),
        items=items,
        minutes=len(arrivals),
        limits=limits,
        horizon=horizon,
    )
    assert tight.optimal
    assert brute_force(limits, arrivals, items) <= tight.upper


def test_the_program_where_the_max_flow_is_loose():
    """One provider of 3 a minute and 2 a day, the batch allowed 1 a minute: at the first
    reset it starts 1, and the minute's jobs must take the day's other request, so 1 is all any
    schedule serves. The max-flow bound says 2 (it counts as surely served only the room no
    schedule can take away, and the day could be full by then); the program says 1."""
    limits = {"p": (3, 2, 1, 2)}
    arrivals = [4, 2, 2, 2, 2]
    minutes = len(arrivals)
    found = bound(dict(enumerate(arrivals)), items=100, minutes=minutes, limits=limits)
    tight = tight_upper(
        dict(enumerate(arrivals)), items=100, minutes=minutes, limits=limits, horizon=minutes
    )
    assert found.upper == 2
    assert brute_force(limits, arrivals, 100) == found.served == tight.upper == 1
    alone = tight_upper({}, items=100, minutes=minutes, limits=limits, horizon=minutes)
    assert alone.upper == 2  # with no jobs to take its room, the batch has the day


async def test_replay_answers_as_the_fake_does(autojump_clock):
    """The fake's quota replayed on its log refuses exactly what the fake refused, and why."""
    times = [0.0, 1.0, 2.0, 3.0, 61.0, 62.0, 63.0, 64.0, 121.0, 86401.0]
    async with open_fake("q", models=("m",)) as fake, httpx2.AsyncClient() as http:
        fake.script("m", quota(3, day_limit=7))
        statuses = []
        for t in times:
            await trio.sleep_until(t)
            body = {"model": "m", "messages": [{"role": "user", "content": "batch item"}]}
            statuses.append(
                (await http.post(f"{fake.base_url}/chat/completions", json=body)).status_code
            )
        requests = [(r.at, True) for r in fake.log]
    answers = replay(requests, 3, 7)
    assert [a == "ok" for a in answers] == [s == 200 for s in statuses]
    assert answers == ["ok"] * 3 + ["minute"] + ["ok"] * 3 + ["minute", "ok", "ok"]
    rule = obeyed(requests, answers, 2, 5)  # a rule of 2 a minute and 5 a day, broken on purpose
    assert rule == {"over_minute": 2, "over_day": 2, "refused": {"minute": 2, "day": 0}}
