"""The terms that protect shared money — the daily paid ceiling and the consent mode — and what the
hosts sharing a state store tell each other about them and about their clocks.

Every host (every process, for SQLite) announces the terms its config gives, and beats every sync:
the store keeps each host's announcement with the time it was made (on the store's clock: start-up,
or a re-announcement after a reload) and the time it was last seen. The store's terms are the
**strictest** of the live announcements — a lower ceiling; consent `free_tier_only` < `off` < `ask`
< `allow` — so a host configured looser than another never spends past the stricter one, and a
host configured stricter never has its ceiling raised by another. An operator's `lanes ceiling
set` stands over every announcement made before it (it may raise the ceiling: the operator
decided), and is itself held to the strictest announced after it (a host started or reloaded since
with a stricter config). An announcement not seen for `LIVE_S` is dropped: a host gone does not
hold the others back for ever.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import attrs

# lanes: pure

ConsentMode = Literal["free_tier_only", "off", "ask", "allow"]
CONSENTS: tuple[ConsentMode, ...] = ("free_tier_only", "off", "ask", "allow")  # strictest first
V = TypeVar("V")
LIVE_S = 30.0  # an announcement not seen for this long is a host gone
MAX_CEILING_USD = 1e6  # what an operator may set, at most


@attrs.frozen(kw_only=True)
class Terms:
    ceiling_usd: float
    consent: ConsentMode


def consent_of(fallback: str, free_tier_only: bool) -> ConsentMode:
    """A policy's consent mode as one word (`free_tier_only` wins over the fallback mode)."""
    if free_tier_only:
        return "free_tier_only"
    return _consent(fallback) or "off"


@attrs.frozen(kw_only=True)
class Announced:
    """One host's configured terms, as the store keeps them."""

    host: str  # its id in the store
    label: str  # who it is, for people: "hostname:pid"
    terms: Terms
    at: float  # store clock: when it announced them (start-up or a reload)
    seen: float  # store clock: its last beat


@attrs.frozen(kw_only=True)
class Operator:
    """What an operator set (`lanes ceiling set`), field by field, with when (store clock)."""

    ceiling_usd: float | None = None
    ceiling_at: float = 0.0
    consent: ConsentMode | None = None
    consent_at: float = 0.0
    by: str = ""  # the host that wrote it


@attrs.frozen(kw_only=True)
class Agreed:
    """The store's terms, and who set each field (a host's label, or "operator via <label>")."""

    terms: Terms
    ceiling_by: str
    consent_by: str


def merged(old: Operator, new: Operator) -> Operator:
    """What an operator set, `new`'s fields over `old`'s (a field `new` leaves unset stays)."""
    ceiling, consent = new.ceiling_usd is not None, new.consent is not None
    return Operator(
        ceiling_usd=new.ceiling_usd if ceiling else old.ceiling_usd,
        ceiling_at=new.ceiling_at if ceiling else old.ceiling_at,
        consent=new.consent if consent else old.consent,
        consent_at=new.consent_at if consent else old.consent_at,
        by=new.by,
    )


def live(announced: Sequence[Announced], now: float) -> list[Announced]:
    """The announcements seen within `LIVE_S` of `now`."""
    return [a for a in announced if a.seen >= now - LIVE_S]


def agree(announced: Sequence[Announced], operator: Operator | None, now: float) -> Agreed | None:
    """The store's terms at `now`: per field, the strictest of the operator's value and the live
    announcements made after it (all live ones when the operator set none). None when there is
    nothing to agree on (no live announcement, no operator)."""
    hosts = live(announced, now)
    op = operator or Operator()
    by = f"operator via {op.by}"
    ceilings = [(a.terms.ceiling_usd, a.at, a.label) for a in hosts if a.at > op.ceiling_at]
    if op.ceiling_usd is not None:
        ceilings.append((op.ceiling_usd, op.ceiling_at, by))
    consents = [(a.terms.consent, a.at, a.label) for a in hosts if a.at > op.consent_at]
    if op.consent is not None:
        consents.append((op.consent, op.consent_at, by))
    ceiling = _strictest(ceilings, float)
    consent = _strictest(consents, CONSENTS.index)
    if ceiling is None or consent is None:
        return None
    return Agreed(
        terms=Terms(ceiling_usd=float(ceiling[0]), consent=consent[0]),
        ceiling_by=ceiling[1],
        consent_by=consent[1],
    )


def _strictest(
    options: list[tuple[V, float, str]], rank: Callable[[V], float]
) -> tuple[V, str] | None:
    """The strictest (lowest `rank`) option's (value, who); the earliest among equals."""
    if not options:
        return None
    value, _, who = min(options, key=lambda o: (rank(o[0]), o[1]))
    return value, who


@attrs.frozen(kw_only=True)
class Beat:
    """What a host says at every sync: the terms its config gives, and its view of the clock."""

    host: str
    label: str
    terms: Terms
    fresh: bool  # a new announcement (start-up, a reload): stamped anew
    wall: float  # its wall source when it beats
    skew_s: float | None  # the store's clock minus its wall, as it last measured (None: not yet)
    now: float  # its trusted time: what a store with no clock of its own (SQLite) stamps with


@attrs.frozen(kw_only=True)
class Host:
    """One host as the store keeps it: its announcement, and its view of the clock at its last
    beat (its wall, so its UTC day, and its skew)."""

    announced: Announced
    wall: float
    skew_s: float | None


@attrs.frozen(kw_only=True)
class Pulse:
    """What a beat learns: the store's clock (None: it has none of its own — SQLite, whose
    processes share the host's), the store's terms, the operator's, every live host, and every
    other host's entry as read (live or not by this host's clock, which may be the wrong one)."""

    store_time: float | None
    agreed: Agreed | None
    operator: Operator | None
    hosts: tuple[Host, ...]
    others: tuple[Host, ...] = ()


def beat(
    hosts: Sequence[Host], operator: Operator | None, beat: Beat, now: float
) -> tuple[Host, list[str], Pulse]:
    """One beat at `now` (the store's clock) over the hosts the store keeps: this host's entry as
    it is to be written, the ids of the entries to drop (gone for `LIVE_S`), and the pulse."""
    old = next((h for h in hosts if h.announced.host == beat.host), None)
    at = now if beat.fresh or old is None or old.announced.terms != beat.terms else old.announced.at
    own = Host(
        announced=Announced(host=beat.host, label=beat.label, terms=beat.terms, at=at, seen=now),
        wall=beat.wall,
        skew_s=beat.skew_s,
    )
    others = [h for h in hosts if h.announced.host != beat.host]
    alive = [h for h in others if h.announced.seen >= now - LIVE_S]
    gone = [h.announced.host for h in others if h.announced.seen < now - LIVE_S]
    kept = (own, *alive)
    agreed = agree([h.announced for h in kept], operator, now)
    pulse = Pulse(
        store_time=None, agreed=agreed, operator=operator, hosts=kept, others=tuple(others)
    )
    return own, gone, pulse


def host_fields(host: Host) -> dict[str, object]:
    """A host's entry as the store keeps it (short keys; numbers as repr text, exact in Lua too)."""
    a = host.announced
    return {
        "l": a.label,
        "c": repr(a.terms.ceiling_usd),
        "m": a.terms.consent,
        "a": repr(a.at),
        "s": repr(a.seen),
        "w": repr(host.wall),
        "k": None if host.skew_s is None else repr(host.skew_s),
    }


def host_from(host_id: str, data: dict[str, object]) -> Host | None:
    """The inverse of `host_fields`; None for an entry we can not read."""
    try:
        consent = _consent(data["m"])
        if consent is None:
            return None
        skew = data.get("k")
        terms = Terms(ceiling_usd=_number(data["c"]), consent=consent)
        announced = Announced(
            host=host_id[:64],
            label=str(data["l"])[:80],
            terms=terms,
            at=_number(data["a"]),
            seen=_number(data["s"]),
        )
        return Host(
            announced=announced,
            wall=_number(data["w"]),
            skew_s=None if skew is None else _number(skew),
        )
    except (KeyError, TypeError, ValueError):
        return None


def operator_fields(op: Operator) -> dict[str, object]:
    return {
        "c": None if op.ceiling_usd is None else repr(op.ceiling_usd),
        "ca": repr(op.ceiling_at),
        "m": op.consent,
        "ma": repr(op.consent_at),
        "by": op.by,
    }


def operator_from(data: dict[str, object]) -> Operator | None:
    """The inverse of `operator_fields`; None for a record we can not read."""
    try:
        consent = _consent(data.get("m"))
        if consent is None and data.get("m") is not None:
            return None
        ceiling = data.get("c")
        return Operator(
            ceiling_usd=None if ceiling is None else _number(ceiling),
            ceiling_at=_number(data["ca"]),
            consent=consent,
            consent_at=_number(data["ma"]),
            by=str(data.get("by", ""))[:80],
        )
    except (KeyError, TypeError, ValueError):
        return None


def _consent(value: object) -> ConsentMode | None:
    return next((c for c in CONSENTS if c == value), None)


def _number(value: object) -> float:
    """A finite number from a stored field (text or a number); ValueError otherwise."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError("not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number
