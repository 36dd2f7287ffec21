"""The bound for `bench/batchday.py`: the most batch items any scheduler could serve free under
lanes' headroom rule (`FreeTierManager.classify` with `[batch] headroom` h, default 0.2) over the
same day of interactive arrivals, the interactive jobs served free first wherever a quota has room.

The model, per provider p with R and D its per-minute and per-day quotas (minutes and the day as
the fakes count them; one day):
- batch items may start at a minute's reset — lanes' put-back items are due then, before that
  minute's interactive jobs arrive — as many as the rule lets them. The rule keeps
  k = `kept(R, h)` = ⌈R·h⌉ whole requests of a quota for interactive work: where the provider
  reports the minute in headers (all but the gemini-style one) an item starts while remaining > k
  (`_kept_for_interactive`), and where our config knows R (`rpm`) while the counted use < R − k
  (`_over_local_limit`); both give r = R − k starts from an empty minute (8, 4, 16, 6, 24 here).
  An item may start only while the day's counted use — interactive and batch — is below
  D − ⌈D·h⌉ where our config knows D (`rpd`): that is d. Where it does not (the unconfigured
  provider, whose headers speak of the minute only) nothing holds the batch back and the quota is
  the limit: d = D.
- each interactive job is served free on some provider whose minute and day have room, if one
  has; only when none has does it go to the paid lane (lanes' free-first routing). Which provider
  is the oracle's choice.
- nothing else: no latency, no probes, no 429s; lanes knows every reset; the batch keeps to the
  rule (lanes did not everywhere: the report's "over the rule" column). Interactive jobs served
  first in their minute (b ≤ r − i) would be tighter than what the rule allows, so not a bound.

The oracle fills every provider the batch is not done with to r at each reset (an item started
later never sees less of the day used), then places each interactive job on a provider the batch
is done with (the day's use at d, or no items left) — it costs the batch nothing there — else on
the provider the batch is nearest done with, else the paid lane. The batch then serves Σ d less
the interactive jobs placed before it was done, at most the items. `tests/test_bench_batchday.py`
checks this against every schedule and placement of small cases. The oracle's finish is the minute
of its last batch item; the rule's ceiling, the same with no interactive traffic, its upper limit.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from bench.freeshare import PROVIDERS
from lanes._core.freetier.manager import kept

DAY_S = 86400


def allowed(limit: int, headroom: float) -> int:
    """Batch starts the headroom rule permits in one window of `limit` from an empty one: the
    rule keeps `kept(limit, headroom)` (lanes' own function: the share rounded up to whole
    requests) for interactive work — counted, `used >= limit - kept` holds back; reported,
    `remaining <= kept` does: the same number either way."""
    return max(0, limit - kept(limit, headroom))


def caps(headroom: float) -> dict[str, tuple[int, int, int, int]]:
    """Per provider: (R, D, r, d) — its quotas and what the rule lets a batch start, per minute
    and per day (see the module's text)."""
    found = {}
    for name, rpm, rpd, _, known in PROVIDERS:
        r = allowed(rpm, headroom)
        d = allowed(rpd, headroom) if known else rpd
        found[name] = (rpm, rpd, r, d)
    return found


Limits = Mapping[str, tuple[int, int, int, int]]  # provider → (R, D, r, d), see `caps`


@attrs.frozen(kw_only=True)
class Bound:
    """`upper`: no schedule serves more items (see `upper`); `served`: the oracle's schedule
    serves this many (so the best lies between), `per_provider` of them, its last at `finish_s`
    (seconds from the batch's start: the start of that minute; None when it serves none)."""

    upper: int
    served: int
    per_provider: Mapping[str, int]
    finish_s: float | None


def bound(arrivals: Mapping[int, int], *, items: int, minutes: int, limits: Limits) -> Bound:
    """The oracle's schedule and the upper bound of the module's text: `arrivals[minute]`
    interactive jobs arriving in each minute, the batch's `items` all waiting from minute 0 for
    `minutes`."""
    used = dict.fromkeys(limits, 0)  # the day's use, batch and interactive
    served = dict.fromkeys(limits, 0)
    left, last = items, None
    for minute in range(minutes):
        this = dict.fromkeys(limits, 0)  # the minute's use
        for name, (_, rpd, r, d) in limits.items():
            b = max(0, min(r, d - used[name], rpd - used[name], left))
            used[name] += b
            served[name] += b
            this[name] = b
            left -= b
            if b:
                last = minute
        for _ in range(arrivals.get(minute, 0)):
            room = [n for n, (rpm, rpd, _, _) in limits.items() if this[n] < rpm and used[n] < rpd]
            if not room:
                break  # the rest of the minute's jobs go to the paid lane
            done = [n for n in room if used[n] >= limits[n][3] or not left]
            if done:
                name = max(done, key=lambda n: limits[n][1] - used[n])
            else:
                name = min(room, key=lambda n: limits[n][3] - used[n])
            used[name] += 1
            this[name] += 1
    return Bound(
        upper=upper(arrivals, items=items, minutes=minutes, limits=limits),
        served=items - left,
        per_provider=served,
        finish_s=None if last is None else last * 60.0,
    )


def upper(arrivals: Mapping[int, int], *, items: int, minutes: int, limits: Limits) -> int:
    """No schedule serves more: the items; each provider's d, or r a minute for `minutes`; and,
    when the items outnumber the d's together (so the batch goes on starting items wherever the
    rule lets it), the d's less the interactive jobs that must be served where the batch is not
    yet done. Those are, before any minute T, at least the free room every minute surely has for
    them (R − r on each provider whose day can not be full yet) less the most of them that could
    be placed on providers done by then — a max-flow: minute → provider (R a minute, from the
    first minute its use could reach d) → the day (D − d), exactly the least of the
    2^providers cuts of the provider → day edges. The best T is taken."""
    rate = sum(min(d, minutes * r) for _, _, r, d in limits.values())
    shares = sum(d for _, _, _, d in limits.values())
    if items < shares:
        return min(items, rate)
    names = list(limits)
    done_at = {n: _first(rpm, d) for n, (rpm, _, _, d) in limits.items()}
    full_at = {n: _first(rpm, rpd) for n, (rpm, rpd, _, _) in limits.items()}
    cuts = list(itertools.product((False, True), repeat=len(names)))
    cost = [  # each cut's capacity so far: its provider → day edges, then minute by minute
        sum(limits[n][1] - limits[n][3] for n, c in zip(names, cut, strict=True) if c)
        for cut in cuts
    ]
    best = surely = 0
    for minute in range(minutes):
        count = arrivals.get(minute, 0)
        room = sum(rpm - r for n, (rpm, _, r, _) in limits.items() if minute < full_at[n])
        surely += min(count, room)
        for k, cut in enumerate(cuts):
            done = sum(
                limits[n][0]
                for n, c in zip(names, cut, strict=True)
                if not c and minute >= done_at[n]
            )
            cost[k] += min(count, done)
        best = max(best, surely - min(cost))
    return min(items, rate, shares - best)


def _first(rpm: int, use: int) -> int:
    """The first minute in which a provider's use could reach `use`, at `rpm` a minute."""
    return max(0, -(-use // rpm) - 1)


def arrivals_per_minute(times: Sequence[float]) -> dict[int, int]:
    """Arrival times (seconds from midnight) → jobs arriving in each minute."""
    found: dict[int, int] = {}
    for t in times:
        found[int(t // 60)] = found.get(int(t // 60), 0) + 1
    return found


def per_minute(served: Sequence[tuple[float, str]]) -> dict[str, dict[int, int]]:
    """(seconds from midnight, provider) of each job served free → provider → minute → count."""
    found: dict[str, dict[int, int]] = {}
    for t, lane in served:
        minutes = found.setdefault(lane, {})
        minutes[int(t // 60)] = minutes.get(int(t // 60), 0) + 1
    return found


def replay(requests: Sequence[tuple[float, bool]], rpm: int, rpd: int) -> list[str]:
    """What a fake under `quota(rpm, day_limit=rpd)` answered each of `requests` ((trio time,
    from the batch), in the order received): "ok", or "minute" / "day" for the quota that refused
    it (429) — the fake's own rule, replayed; `rpm` 0: no quota (the paid fake)."""
    minutes: dict[int, int] = {}
    days: dict[int, int] = {}
    answers = []
    for at, _ in requests:
        minute, day = int(at // 60), int(at // DAY_S)
        if rpm and rpd and days.get(day, 0) >= rpd:
            answers.append("day")
        elif rpm and minutes.get(minute, 0) >= rpm:
            answers.append("minute")
        else:
            minutes[minute] = minutes.get(minute, 0) + 1
            days[day] = days.get(day, 0) + 1
            answers.append("ok")
    return answers


def obeyed(requests: Sequence[tuple[float, bool]], answers: Sequence[str], r: int, d: int) -> Any:
    """How the batch kept to the rule on one provider: its items served while the minute's use
    (everyone's, served) had reached `r`, or the day's had reached `d`; its 429s by quota."""
    minutes: dict[int, int] = {}
    days: dict[int, int] = {}
    over_minute = over_day = 0
    refused = {"minute": 0, "day": 0}
    for (at, from_batch), answer in zip(requests, answers, strict=True):
        if answer != "ok":
            refused[answer] += from_batch
            continue
        minute, day = int(at // 60), int(at // DAY_S)
        if from_batch:
            over_minute += minutes.get(minute, 0) >= r
            over_day += days.get(day, 0) >= d
        minutes[minute] = minutes.get(minute, 0) + 1
        days[day] = days.get(day, 0) + 1
    return {"over_minute": over_minute, "over_day": over_day, "refused": refused}
