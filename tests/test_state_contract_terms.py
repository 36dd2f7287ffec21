"""The shared terms' contract (`SharedTerms`), on both backends: the store's terms agree on the
strictest live announcement, or what an operator set over the announcements before it; a host
that leaves holds no one back; and every reservation is held to the agreed ceiling in its own
transaction (SQLite) or script (Redis), whatever ceiling the host passes."""

from __future__ import annotations

import time

import pytest
from state_backends import BACKENDS, open_state

from lanes._core.freetier.windows import window_id
from lanes._core.state import terms
from lanes._core.state.paid import PaidAsk
from lanes._core.state.store import Store
from lanes._core.state.terms import Operator, Terms


@pytest.fixture(params=BACKENDS)
def two(request, tmp_path):
    """Two processes (SQLite: one file) or two hosts (Redis: one server) sharing one store."""
    with open_state(request, tmp_path) as state:
        yield state.pair()


def beat(store: Store, ceiling: float, consent: str = "allow", *, fresh: bool = False):
    now = time.time()
    pulse = store.heartbeat(
        terms.Beat(
            host=store.host_id,
            label=store.host_id,
            terms=Terms(ceiling_usd=ceiling, consent=consent),  # type: ignore[arg-type]
            fresh=fresh,
            wall=now,
            skew_s=0.0,
            now=now,
        )
    )
    assert pulse is not None and pulse.agreed is not None
    return pulse


def reserve(store: Store, amount: float, ceiling: float) -> str | None:
    return store.reserve(
        PaidAsk(
            day=window_id("day", time.time()),
            amount=amount,
            ceiling=ceiling,
            lane="paid",
            model="m",
            job="j",
            cohort=None,
            wall=time.time(),
            tolerance_s=120.0,
        )
    )


def test_two_hosts_agree_on_the_stricter_terms(two):
    """Hosts announcing $0.01/allow and $0.002/ask both read $0.002 and ask, named by who set
    them; each host's configured terms stay listed."""
    loose, strict = two
    beat(loose, 0.01, "allow", fresh=True)
    beat(strict, 0.002, "ask", fresh=True)
    pulse = beat(loose, 0.01, "allow")
    assert pulse.agreed.terms == Terms(ceiling_usd=0.002, consent="ask")
    assert pulse.agreed.ceiling_by == strict.host_id
    assert sorted(h.announced.terms.ceiling_usd for h in pulse.hosts) == [0.002, 0.01]


def test_a_reservation_is_held_to_the_stores_ceiling_whatever_the_host_asks(two):
    """A host that passes its own looser ceiling (it has not seen the stricter announcement yet)
    is still held to the store's: the cap is in the reservation's own transaction or script."""
    loose, strict = two
    beat(loose, 0.01, fresh=True)
    beat(strict, 0.002, fresh=True)
    assert reserve(loose, 0.0015, ceiling=0.01) is not None
    assert reserve(loose, 0.001, ceiling=0.01) is None  # 0.0025 would cross the store's 0.002
    assert reserve(loose, 0.0005, ceiling=0.01) is not None  # exactly 0.002: allowed


def test_an_operator_sets_the_terms_until_a_stricter_host_arrives(two):
    """`lanes ceiling set` raises (or lowers) the store's ceiling over earlier announcements; a
    host announcing a stricter one afterwards is stricter again; a host leaving stops holding
    the others back."""
    a, b = two
    beat(a, 0.002, fresh=True)
    beat(b, 0.01, fresh=True)
    a.set_terms(Operator(ceiling_usd=0.05, ceiling_at=time.time(), by="ops", consent_at=0.0))
    raised = beat(b, 0.01)
    assert raised.agreed.terms.ceiling_usd == 0.05
    assert raised.agreed.ceiling_by == "operator via ops"
    assert raised.agreed.terms.consent == "allow"  # the operator set no consent
    lowered = beat(b, 0.001, fresh=True)  # b reloads with a stricter ceiling
    assert lowered.agreed.terms.ceiling_usd == 0.001
    b.withdraw()
    assert beat(a, 0.002).agreed.terms.ceiling_usd == 0.05  # b is gone: the operator's again
