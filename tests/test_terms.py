"""One ceiling per store: the terms protecting shared money (the daily paid ceiling, the consent
mode) agree on the strictest a live host announces, or what an operator set (issue 28, Build 4).

The rule is pure (`state/terms.py`, Hypothesis below); both stores run it in one atomic step — a
SQLite immediate transaction, a Redis WATCH transaction — and hold every reservation to the
agreed ceiling in the reservation's own transaction or script (the contract tests,
tests/test_state_contract_terms.py, parametrized over SQLite and a real redis-server).
"""

from __future__ import annotations

import sqlite3
import time

import trio
from hypothesis import given
from hypothesis import strategies as st

from lanes._core.state import terms
from lanes._core.state.store import SQLiteStore, Store
from lanes._core.state.terms import CONSENTS, LIVE_S, Announced, Operator, Terms, agree

NOW = 1_800_000_000.0
ceilings = st.floats(0, 100, allow_nan=False)
consents = st.sampled_from(CONSENTS)
all_terms = st.builds(Terms, ceiling_usd=ceilings, consent=consents)


def rank(consent: str) -> int:
    return CONSENTS.index(consent)


# -- the rule (pure) ---------------------------------------------------------------------------


announcement = st.builds(
    Announced,
    host=st.sampled_from(["a", "b", "c", "d"]),
    label=st.sampled_from(["a:1", "b:2"]),
    terms=all_terms,
    at=st.floats(NOW - 100, NOW, allow_nan=False),
    seen=st.floats(NOW - 2 * LIVE_S, NOW, allow_nan=False),
)


@given(st.lists(announcement, max_size=6))
def test_without_an_operator_the_strictest_live_host_wins(announced):
    """With no operator's terms the store's ceiling and consent are the strictest of the live
    announcements; a host not seen for LIVE_S holds no one back."""
    alive = [a for a in announced if a.seen >= NOW - LIVE_S]
    agreed = agree(announced, None, NOW)
    if not alive:
        assert agreed is None
        return
    assert agreed is not None
    assert agreed.terms.ceiling_usd == min(a.terms.ceiling_usd for a in alive)
    assert agreed.terms.consent == min((a.terms.consent for a in alive), key=rank)


@given(
    st.lists(announcement, max_size=6),
    st.floats(0, 100, allow_nan=False),
    st.floats(NOW - 100, NOW, allow_nan=False),
    consents,
)
def test_an_operators_terms_stand_over_what_was_announced_before(announced, usd, at, consent):
    """An operator's ceiling replaces every announcement made before it — higher or lower — and
    is held to the strictest live announcement made after it; its consent likewise."""
    op = Operator(ceiling_usd=usd, ceiling_at=at, consent=consent, consent_at=at, by="a:1")
    agreed = agree(announced, op, NOW)
    assert agreed is not None
    later = [a for a in announced if a.seen >= NOW - LIVE_S and a.at > at]
    assert agreed.terms.ceiling_usd == min([usd, *(a.terms.ceiling_usd for a in later)])
    assert agreed.terms.consent == min([consent, *(a.terms.consent for a in later)], key=rank)
    if all(a.terms.ceiling_usd > usd for a in later):
        assert agreed.ceiling_by == "operator via a:1"


@given(st.lists(announcement, min_size=1, max_size=6), all_terms)
def test_a_host_can_never_loosen_another_hosts_terms(announced, mine):
    """Whatever another host announces, the store's terms are never looser than this host's own
    (no operator): another host can lower the ceiling, never raise it."""
    own = Announced(host="me", label="me:1", terms=mine, at=NOW, seen=NOW)
    agreed = agree([own, *announced], None, NOW)
    assert agreed is not None
    assert agreed.terms.ceiling_usd <= mine.ceiling_usd
    assert rank(agreed.terms.consent) <= rank(mine.consent)


@given(st.dictionaries(st.text(max_size=5), st.none() | st.text(max_size=5) | st.floats()))
def test_a_stored_entry_we_can_not_read_is_skipped(data):
    """Whatever a store holds for a host or an operator, reading it never raises."""
    terms.host_from("h", data)
    terms.operator_from(data)


# -- the stores (their contract: tests/test_state_contract_terms.py) -------------------------------


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


def test_a_host_not_seen_for_a_while_holds_no_one_back(tmp_path):
    """An announcement whose process stopped beating (killed) lapses after LIVE_S (SQLite: the
    host's clock, passed in, stamps the beats)."""
    a, b = (SQLiteStore(str(tmp_path / "s.db")) for _ in range(2))
    beat(b, 0.001, fresh=True)
    now = time.time() + LIVE_S + 1  # b has not beaten since
    pulse = a.heartbeat(
        terms.Beat(
            host=a.host_id,
            label="a",
            terms=Terms(ceiling_usd=0.01, consent="allow"),
            fresh=True,
            wall=now,
            skew_s=0.0,
            now=now,
        )
    )
    assert pulse.agreed is not None and pulse.agreed.terms.ceiling_usd == 0.01
    assert [h.announced.host for h in pulse.hosts] == [a.host_id]
    a.close()
    b.close()


def test_an_operators_terms_survive_a_store_that_lost_them(tmp_path):
    """A state file replaced under a process: the operator's terms it last saw are written back
    with its view, so a lowered ceiling is not forgotten."""
    path = tmp_path / "s.db"
    store = SQLiteStore(str(path))
    operator = Operator(ceiling_usd=0.0, ceiling_at=NOW, by="ops")
    store.set_terms(operator)
    path.unlink()
    assert store.begin_sync(NOW) is True
    from lanes._core.state.store import LocalView

    view = LocalView(
        usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset(), operator=operator
    )
    store.reseed(view, NOW)
    other = SQLiteStore(str(path))
    pulse = beat(other, 1.0, fresh=True)
    assert pulse.agreed.terms.ceiling_usd == 0.0
    store.close()
    other.close()


def test_reading_terms_never_trusts_a_malformed_row(tmp_path):
    """A host row the store can not read is skipped, never fatal, and never loosens the terms."""
    path = tmp_path / "s.db"
    store = SQLiteStore(str(path))
    with sqlite3.connect(path) as other:
        other.execute("INSERT INTO host_beat (host, data) VALUES ('x', 'not json')")
        other.execute("""INSERT INTO host_beat (host, data) VALUES ('y', '{"c": "nan"}')""")
    pulse = beat(store, 0.5, fresh=True)
    assert pulse.agreed.terms.ceiling_usd == 0.5 and len(pulse.hosts) == 1
    store.close()


async def test_a_reload_s_new_worker_announces_and_a_reload_on_every_host_raises_the_ceiling(
    autojump_clock, tmp_path, env, caplog_lanes
):
    """A reload starts a new worker with the new config, which announces its terms: a looser
    ceiling governs only once every host announces it (the old worker gone, its announcement
    withdrawn); another host's stricter one holds it down. Only a disagreement is logged, and its
    end."""
    import attrs

    import lanes
    from helpers import config, paid_lane

    cfg = config(
        paid_lane("paid", "http://127.0.0.1:9"),
        state=str(tmp_path / "s.db"),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 0.01},
    )
    looser = attrs.evolve(cfg, policy=attrs.evolve(cfg.policy, paid_ceiling_usd_per_day=0.05))
    strict = attrs.evolve(cfg, policy=attrs.evolve(cfg.policy, paid_ceiling_usd_per_day=0.003))

    def ceiling(dispatcher: lanes.Dispatcher) -> float:
        return dispatcher.statistics().paid_ceiling_usd

    leave, olds = trio.Event(), []

    async def old_worker() -> None:
        async with lanes.open_dispatcher(cfg, env=env) as old:
            olds.append(old)
            await leave.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(old_worker)
        await trio.sleep(0.1)
        async with lanes.open_dispatcher(looser, env=env) as new:  # the reload's new worker
            await trio.sleep(1)  # a sync of each
            while_both = (ceiling(olds[0]), ceiling(new))
            leave.set()  # the old worker leaves: its announcement is withdrawn
            await trio.sleep(1)
            raised = ceiling(new)
            async with lanes.open_dispatcher(strict, env=env):  # another host, stricter
                await trio.sleep(1)
                held = ceiling(new)
    assert (while_both, raised, held) == ((0.01, 0.01), 0.05, 0.003)
    said = [r.getMessage() for r in caplog_lanes.records if "paid terms" in r.getMessage()]
    assert len(said) == 4 and "again" in said[1] and "again" in said[3], said  # the strict left
    assert "the state store's are $0.01 " in said[0] and "the state store's are $0.003" in said[2]
