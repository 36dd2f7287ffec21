"""The Redis store against a real redis-server: what only Redis does — keys that expire on their
own, events published to the other hosts, an outage and a restart that forgot everything, exact
pico-dollar totals. The rules both backends keep are the contract suites'
(tests/test_state_contract_*.py).

Two `RedisStore` objects on one server stand for two hosts. Nothing here sleeps for timing: expiry
is checked through Redis' own TTLs, concurrency with real threads racing on real sockets.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from lanes._core.freetier.backoff import Backoff, Reason
from lanes._core.freetier.windows import end_of, window_id
from lanes._core.state.backend import text
from lanes._core.state.paid import PaidAsk
from lanes._core.state.redis_store import RedisStore, redacted
from lanes._core.state.store import LocalView, SQLiteStore, StoreUnavailable
from lanes._core.state.terms import Beat, Operator, Terms


def host(url: str, *, timeouts_s: float | None = None) -> RedisStore:
    """A host's store on `url`, synchronised once; `timeouts_s` for both its connect and its
    read timeouts (else the store's own)."""
    local = SQLiteStore(":memory:")
    # no hold after a loss (its own test below): these tests follow who put what back
    store = (
        RedisStore(url, local=local, loss_hold_s=0.0)
        if timeouts_s is None
        else RedisStore(
            url, local=local, connect_timeout_s=timeouts_s, timeout_s=timeouts_s, loss_hold_s=0.0
        )
    )
    store.begin_sync(time.time())
    store.flush()  # a first full sync: the store is up
    return store


def is_up(store: RedisStore) -> bool:
    """Read `store.up` afresh: a bare `assert not store.up` would leave mypy sure it stays False
    across the calls that bring the store back up."""
    return store.up


def backoff(until: float, reason: Reason = "rate_limited") -> Backoff:
    return Backoff(until=until, step=1, reason=reason, source="retry-after")


def test_a_backoff_key_expires_on_its_own_at_the_deadline(redis_server):
    """A backoff is a key that expires by itself at its deadline (the race between two hosts is
    the contract's: tests/test_state_contract_memory.py)."""
    a, b = host(redis_server.url), host(redis_server.url)
    now = time.time()
    a.put_backoffs({"groq/*": backoff(now + 30)})
    b.put_backoffs({"groq/*": backoff(now + 10)})
    ttl_ms = redis.Redis.from_url(redis_server.url).pttl("lanes:backoff:groq/*")
    assert 29_000 < ttl_ms <= 30_001


def test_usage_counters_expire_at_the_window_end(redis_server):
    """Each window's hash of counts expires at its UTC end, plus a minute's grace (that counts add
    up across hosts is the contract's: tests/test_state_contract_memory.py)."""
    a = host(redis_server.url)
    now = time.time()
    day = window_id("day", now)
    a.add_usage([(("groq/*", "requests", "day", day), 3)], {})
    ttl = redis.Redis.from_url(redis_server.url).ttl(f"lanes:usage:day:{day}")
    assert abs(ttl - (end_of("day", day) + 60 - now)) <= 2


def test_kill_switch_grants_and_probe_results_are_published(redis_server):
    """Switches, grants, probe results reach the other host as events, and a lease is exclusive."""
    a, b = host(redis_server.url), host(redis_server.url)
    assert b.listen(0.05) == []  # subscribed
    now = time.time()
    assert a.probe_lease("groq/*", ttl_s=5.0) is True
    assert b.probe_lease("groq/*", ttl_s=5.0) is False  # one host probes for all
    a.put_switch("free", True, now)
    a.put_grant("ci", now + 3600, now)
    a.probe_done("groq/*", ok=True)
    a.flush()
    events = []
    for _ in range(20):
        events += b.listen(0.1)
        if len(events) >= 3:
            break
    assert [(e["t"], e.get("lane"), e.get("scope"), e.get("ok")) for e in events] == [
        ("grant", None, None, None),
        ("switch", "free", None, None),
        ("probe", None, "groq/*", True),
    ]
    assert b.grant_until("ci") == pytest.approx(now + 3600)
    assert b.switches() == {"free"}
    assert b.probe_lease("groq/*", ttl_s=5.0) is True  # the lease was released
    b.put_backoffs({"groq/*": backoff(now + 30)})
    lease = a.probe_lease("groq/*", ttl_s=5.0)
    assert isinstance(lease, Backoff) and lease.until == pytest.approx(now + 30)  # a closed door
    a.put_switch("free", False, now)
    a.flush()
    assert b.switches() == set()


def test_quarantine_is_shared_and_kept_while_redis_is_down(redis_server, tmp_path):
    """The canary's quarantine is shared; with Redis down the last view stands, verdicts wait."""
    local = SQLiteStore(":memory:")
    a, b = RedisStore(redis_server.url, local=local), host(redis_server.url)
    a.begin_sync(time.time())
    a.flush()
    a.set_quarantine("free/m", "drifted", "3 of 10 answers moved", at=1.0)
    assert "drifted" in b.quarantined()["free/m"]
    redis_server.kill()
    assert "drifted" in b.quarantined()["free/m"]  # the last view stands
    a.set_quarantine("free/n", "failed", "no answer", at=2.0)  # kept in the local file and queued
    assert local.quarantined().keys() == {"free/m", "free/n"}
    redis_server.start()
    a.begin_sync(time.time())
    a.flush()
    assert b.quarantined().keys() == {"free/n"}  # written when Redis came back


def test_redis_down_fails_fast_and_closes_the_ledger(redis_server):
    """Redis gone: calls fail fast; reservations refused until a full sync puts the ledger back.
    (Its timeouts are 30 s here: a call that waited on one could not pass for fast on a loaded
    machine, and a refused connection fails at once however loaded.)"""
    store = host(redis_server.url, timeouts_s=30.0)
    day = window_id("day", time.time())
    before = store.reserve(
        PaidAsk(day=day, amount=0.1, ceiling=1.0, lane="p", model="m", job="before", cohort=None)
    )
    assert before
    redis_server.kill()
    started = time.monotonic()  # wall-clock: a refused connection must not hang
    with pytest.raises(StoreUnavailable, match="redis at redis://127.0.0.1"):
        store.begin_sync(time.time())
    # a hang detector, not a speed claim: milliseconds when idle, never near the 30 s timeouts
    assert time.monotonic() - started < 5.0  # wall-clock: as above
    assert not store.up
    with pytest.raises(StoreUnavailable):
        store.reserve(
            PaidAsk(
                day=day, amount=0.1, ceiling=1.0, lane="p", model="m", job="during", cohort=None
            )
        )
    store.settle_paid(before, 0.05)  # queued, never lost
    redis_server.start()  # no persistence: Redis forgot everything
    with pytest.raises(StoreUnavailable, match="not synchronised"):
        store.reserve(
            PaidAsk(day=day, amount=0.1, ceiling=1.0, lane="p", model="m", job="early", cohort=None)
        )
    assert store.begin_sync(time.time()) is True  # the loss is noticed
    store.reseed(
        LocalView(
            usage=[(("g/*", "requests", "day", day), 5)],
            spend={},
            backoffs={"g/*": backoff(time.time() + 60)},
            snapshots={},
            switched_off=frozenset({"free"}),
        ),
        time.time(),
    )
    store.flush()
    assert is_up(store)
    other = host(redis_server.url)
    assert other.paid_spent(day) == pytest.approx(0.05)  # our reservation is back, settled
    assert dict(other.usage_totals(time.time()))[("g/*", "requests", "day", day)] == 5
    assert [s for s, _ in other.backoffs(time.time())] == ["g/*"]
    assert other.switches() == {"free"}


def test_the_password_never_reaches_a_message():
    """A Redis password appears in no message or page."""
    assert redacted("redis://:s3cret-pass@10.0.0.5:6380/2") == "redis://10.0.0.5:6380/2"
    store = RedisStore("redis://:s3cret-pass@127.0.0.1:1/0", local=SQLiteStore(":memory:"))
    with pytest.raises(StoreUnavailable) as caught:
        store.begin_sync(time.time())
    assert "s3cret" not in str(caught.value) and "127.0.0.1:1" in str(caught.value)


def test_a_host_forgets_its_own_reservations_after_two_days(redis_server):
    """What a host keeps to push back after a Redis data loss does not grow for ever."""
    store = host(redis_server.url)
    today = window_id("day", time.time())
    for day in (today - 3, today - 1, today):
        store.reserve(
            PaidAsk(
                day=day, amount=0.01, ceiling=1.0, lane="p", model="m", job=f"j{day}", cohort=None
            )
        )
    store.begin_sync(time.time())
    assert sorted(day for day, _ in store._own.values()) == [today - 1, today]


def test_settling_a_large_reservation_keeps_the_total_exact(redis_server):
    """A reservation of 16 digits of pico-dollars settles to the exact integer total."""
    store = host(redis_server.url)
    day = window_id("day", time.time())
    reservation = store.reserve(
        PaidAsk(
            day=day,
            amount=1234.567891234567,
            ceiling=5000.0,
            lane="p",
            model="m",
            job="big",
            cohort=None,
        )
    )
    assert reservation is not None  # well under the ceiling
    store.settle_paid(reservation, 1.000000000001)
    store.flush()
    total = redis.Redis.from_url(redis_server.url).get(f"lanes:paid-total:{day}")
    assert total is not None
    assert int(total) == 1_000_000_000_001


def test_a_probe_lease_is_released_only_after_its_backoff_is_written(redis_server):
    """The probing host's backoff goes out with the lease release: no other host can take the lease
    in between, even when the sync that carries the backoff has not run yet."""
    a, b = host(redis_server.url), host(redis_server.url)
    assert b.listen(0.05) == []
    now = time.time()
    assert a.probe_lease("groq/*", ttl_s=5.0) is True
    a.probe_done(
        "groq/*", ok=False, backoff=backoff(now + 20)
    )  # the 429's backoff, not yet put by a sync
    a.flush()
    closed = b.probe_lease("groq/*", ttl_s=5.0)
    events: list[dict[str, Any]] = []
    for _ in range(20):
        events += b.listen(0.1)
        if len(events) >= 2:
            break
    assert isinstance(closed, Backoff) and closed.until == pytest.approx(now + 20)
    assert [e["t"] for e in events] == [
        "backoff",
        "probe",
    ]  # in this order: waiters wake to a closed door


def test_a_lost_state_is_reported_until_it_has_been_pushed_back(redis_server):
    """If the push-back after a data loss fails, the next sync asks for it again."""
    store = host(redis_server.url)
    redis.Redis.from_url(redis_server.url).flushall()
    assert store.begin_sync(time.time()) is True
    assert store.begin_sync(time.time()) is True  # no reseed yet (say it failed): still due
    store.reseed(
        LocalView(usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset()),
        time.time(),
    )
    assert store.begin_sync(time.time()) is False


def _deployment(url: str, namespace: str = "") -> RedisStore:
    local = SQLiteStore(":memory:")
    store = RedisStore(url, local=local, namespace=namespace)
    store.begin_sync(time.time())
    store.flush()
    return store


def _acts(store: RedisStore, now: float) -> None:
    """What one deployment's hosts do that the others hear of: a switch, a grant, a backoff, a
    probe, a paid reservation."""
    store.put_switch("free", True, now)
    store.put_grant("ci", now + 3600, now)
    store.put_backoffs({"groq/*": backoff(now + 30)}, now)
    assert store.probe_lease("mistral/*", ttl_s=5.0) is True
    store.probe_done("mistral/*", ok=True)
    ask = PaidAsk(day=window_id("day", now), amount=0.5, ceiling=1.0, lane="p", model="m", job="j",
                  cohort=None)  # fmt: skip
    assert store.reserve(ask) is not None
    store.flush()


@pytest.mark.parametrize(
    ("a_at", "b_at"),
    [(("/0", ""), ("/1", "")), (("/0", "team-a"), ("/0", "team-b"))],
    ids=["two databases", "two namespaces on one database"],
)
def test_two_deployments_on_one_server_share_nothing(redis_server, a_at, b_at):
    """Deployments on two databases of one server, or under two `state_namespace`s of one
    database: what A does — a kill switch, a grant, a backoff, a probe, paid spend — B never hears
    of nor reads (pub/sub spans the databases: A's kill switch once switched off B's lane), and
    every key A writes is under its own prefix."""
    base = redis_server.url.rsplit("/", 1)[0]
    a, b = _deployment(base + a_at[0], a_at[1]), _deployment(base + b_at[0], b_at[1])
    assert b.listen(0.05) == []  # subscribed
    now = time.time()
    _acts(a, now)
    heard = []
    for _ in range(5):
        heard += b.listen(0.05)
    assert heard == []
    b.begin_sync(now)
    assert b.switches() == set() and b.grant_until("ci") is None
    assert b.probe_lease("groq/*", ttl_s=5.0) is True  # A's backoff is not B's closed door
    assert b.paid_spent(window_id("day", now)) == 0.0
    if a_at[1]:  # one database: every key A wrote names A's namespace, none B's
        keys = [text(k) for k in redis.Redis.from_url(base + "/0").keys("*")]
        assert keys and all(k.startswith(("lanes:{team-a}:", "lanes:{team-b}:")) for k in keys)
        assert b.paid_spent(window_id("day", now)) == 0.0 < a.paid_spent(window_id("day", now))
    a.close()
    b.close()


def _reserve_on(store: RedisStore, day: int, *, client: str | None = None) -> str | None:
    return store.reserve(
        PaidAsk(day=day, amount=0.01, ceiling=1.0, lane="p", model="m", job="j", cohort=None,
                client=client, client_ceiling=0.5 if client else None)
    )  # fmt: skip


def test_the_ledger_carries_no_expiry_and_old_days_are_pruned(redis_server):
    """The day's ledger and total (a client's too) have no TTL, so no `volatile-*` policy may
    evict them; lanes deletes the days before the server's yesterday itself, at a day's first
    sync, and keeps yesterday's and today's."""
    a = host(redis_server.url)
    today = window_id("day", time.time())
    for day in (today - 5, today - 2, today - 1, today):
        assert _reserve_on(a, day) is not None and _reserve_on(a, day, client="ci") is not None
    raw = redis.Redis.from_url(redis_server.url)
    ledger = sorted(text(k) for k in raw.keys("lanes:paid*"))  # the days marked: one more key
    assert len(ledger) == 17 and all(raw.ttl(k) == -1 for k in ledger)  # -1: no expiry
    assert {int(d) for d in raw.hkeys("lanes:paid-days")} == {
        today - 5,
        today - 2,
        today - 1,
        today,
    }
    host(redis_server.url)  # another host's first sync: its day's pruning
    kept = {int(text(k).split(":")[2]) for k in raw.keys("lanes:paid*") if k != b"lanes:paid-days"}
    assert kept == {today - 1, today}
    assert len(raw.keys("lanes:paid*")) == 9
    assert {int(d) for d in raw.hkeys("lanes:paid-days")} == {today - 1, today}


def test_under_volatile_lru_the_ledger_survives_a_noisy_neighbour(redis_server):
    """A managed Redis' usual policy (`volatile-lru`) and a memory limit, a neighbour writing keys
    with an expiry until Redis evicts thousands: the ledger's total and reservations are all
    still there, exact (with an expiry on them, they were the first to go)."""
    raw = redis.Redis.from_url(redis_server.url)
    a = host(redis_server.url)
    today = window_id("day", time.time())
    reserved = [_reserve_on(a, today) for _ in range(20)]
    assert all(reserved)
    raw.config_set("maxmemory", "3mb")
    raw.config_set("maxmemory-policy", "volatile-lru")
    noise = "x" * 2000
    for batch in range(60):  # ~6 MB of the neighbour's, each key with an hour's expiry
        pipe = raw.pipeline(transaction=False)
        for i in range(50):
            pipe.set(f"neighbour:{batch}:{i}", noise, ex=3600)
        pipe.execute()
    assert int(raw.info("stats")["evicted_keys"]) > 1000
    assert raw.hlen(f"lanes:paid:{today}") == 20
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 20 * 10**10  # 20 x $0.01 in pico
    assert _reserve_on(a, today) is not None  # paid stays open: nothing of the ledger can go


def test_an_evicting_policy_keeps_paid_closed_and_says_so(redis_server, caplog):
    """Under `allkeys-lru` Redis may evict the ledger: paid stays closed from the first sync, with
    one line naming the setting and the fix. Read by CONFIG GET, else by INFO (a user without
    CONFIG, as a managed Redis gives); a user that may run neither: closed too, and said."""
    raw = redis.Redis.from_url(redis_server.url)
    today = window_id("day", time.time())
    raw.config_set("maxmemory-policy", "allkeys-lru")
    raw.execute_command("ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config")
    raw.execute_command("ACL", "SETUSER", "blind", "on", ">pw", "~*", "&*", "+@all", "-config",
                        "-info")  # fmt: skip
    port = redis_server.port
    for url in (redis_server.url, f"redis://noconfig:pw@127.0.0.1:{port}/0"):
        with caplog.at_level("WARNING", logger="lanes"):
            caplog.clear()
            store = host(url)
            with pytest.raises(StoreUnavailable, match="maxmemory-policy is allkeys-lru"):
                _reserve_on(store, today)
        said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
        assert len(said) == 1 and "noeviction" in said[0] and "pw" not in said[0]
    with pytest.raises(StoreUnavailable, match="can not read maxmemory-policy"):
        _reserve_on(host(f"redis://blind:pw@127.0.0.1:{port}/0"), today)
    raw.config_set("maxmemory-policy", "noeviction")
    assert _reserve_on(host(redis_server.url), today) is not None
    raw.config_set("maxmemory-policy", "volatile-lfu")
    assert _reserve_on(host(f"redis://noconfig:pw@127.0.0.1:{port}/0"), today) is not None


@pytest.mark.parametrize("policy_by", ["+info", "+config|get"])
def test_the_documented_acl_user_is_enough(redis_server, policy_by):
    """An ACL user with exactly what docs/operations.md lists — its keys and channels, the
    commands named there, with INFO or CONFIG GET — runs everything a host does: the syncs, a
    reservation, a switch, a grant, a backoff, a probe, the events, a reseed."""
    docs = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
    found = re.search(
        r"\(`(~lanes:\*)`\), its channels \(`(&lanes:\*)`\), and the commands of\s+`([^`]+)`", docs
    )
    assert found is not None, "the ACL user's line in docs/operations.md"
    keys, channels, commands = found.groups()
    raw = redis.Redis.from_url(redis_server.url)
    raw.execute_command(
        "ACL", "SETUSER", "lanes", "on", ">pw", keys, channels,
        *commands.replace("+info", policy_by).split(),
    )  # fmt: skip
    url = f"redis://lanes:pw@127.0.0.1:{redis_server.port}/0"
    a, b = host(url), host(url)
    assert b.listen(0.05) == []
    now = time.time()
    for store in (a, b):  # the beats' WATCH transaction, an operator's terms
        beat = Beat(host=store.host_id, label="h", terms=Terms(ceiling_usd=1.0, consent="allow"),
                    fresh=True, wall=now, skew_s=0.0, now=now)  # fmt: skip
        pulse = store.heartbeat(beat)
        assert pulse is not None and pulse.agreed is not None
    a.set_terms(Operator(ceiling_usd=0.8))
    _acts(a, now)
    heard = []
    for _ in range(20):
        heard += b.listen(0.05)
        if len(heard) >= 3:
            break
    assert {e["t"] for e in heard} >= {"switch", "grant", "probe"}
    raw.flushall()  # a restart without persistence: the reseed writes the view back
    assert a.begin_sync(now) is True
    a.reseed(
        LocalView(usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset()), now
    )
    a.flush()
    assert a.begin_sync(now) is False  # written back: the reservation is counted again
    assert a.paid_spent(window_id("day", now)) > 0 and _reserve_on(a, window_id("day", now))


def test_after_an_outage_a_host_puts_back_its_reservations_a_failover_lost(redis_server):
    """A failover without WAIT can lose the last writes while the epoch (replicated long before)
    survives, so nothing says "Redis forgot". After any outage a host puts its own reservations
    of today back — only those missing, only upward — before paid reopens."""
    raw = redis.Redis.from_url(redis_server.url)
    a = host(redis_server.url, timeouts_s=0.2)
    today = window_id("day", time.time())
    made = [str(_reserve_on(a, today)) for _ in range(3)]

    def outage() -> None:
        redis_server.freeze()
        try:
            with pytest.raises(StoreUnavailable):
                a.begin_sync(time.time())
        finally:
            redis_server.thaw()
        a.begin_sync(time.time())

    raw.delete(f"lanes:paid:{today}", f"lanes:paid-total:{today}")  # the writes a failover lost
    outage()
    assert sorted(text(k) for k in raw.hkeys(f"lanes:paid:{today}")) == sorted(made)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 3 * 10**10
    raw.hset(f"lanes:paid:{today}", "someone-else", 10**10)  # another host's, meanwhile
    raw.incrby(f"lanes:paid-total:{today}", 10**10)
    outage()
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 4 * 10**10  # upward only, once


def test_a_restarted_host_puts_back_what_it_reserved_before(redis_server, tmp_path):
    """A host keeps its own paid reservations of today in its local file: restarted while Redis
    lost its data (a restart without persistence), it puts them back — settled amounts as
    settled — before paid reopens; yesterday's and older are not kept for ever."""
    raw = redis.Redis.from_url(redis_server.url)
    local = str(tmp_path / "local.db")
    today = window_id("day", time.time())
    first = RedisStore(redis_server.url, local=SQLiteStore(local))
    first.begin_sync(time.time())
    first.flush()
    first.records.keep_reservations({"old": (today - 5, 1.0)}, today - 6)  # an older host's day
    made = [str(_reserve_on(first, today)) for _ in range(3)]
    first.settle_paid(made[0], 0.004)
    first.flush()
    first.close()  # the host goes (its memory with it)
    raw.flushall()  # and Redis forgets everything meanwhile
    again = RedisStore(redis_server.url, local=SQLiteStore(local))
    assert again.begin_sync(time.time()) is True  # Redis forgot: a reseed is due
    again.reseed(
        LocalView(usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset()),
        time.time(),
    )
    again.flush()
    assert sorted(text(k) for k in raw.hkeys(f"lanes:paid:{today}")) == sorted(made)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 4 * 10**9 + 2 * 10**10
    assert "old" not in SQLiteStore(local).records.reservations(0)  # older days are dropped


def _beat(*stores: RedisStore) -> None:
    """One beat of each host: each learns the others are live."""
    now = time.time()
    for _ in range(2):  # the second round: every host has seen every other's first beat
        for store in stores:
            terms = Terms(ceiling_usd=1.0, consent="allow")
            beat = Beat(host=store.host_id, label="h", terms=terms, fresh=False, wall=now,
                        skew_s=0.0, now=now)  # fmt: skip
            assert store.heartbeat(beat) is not None


def _sync(store: RedisStore) -> None:
    """One round of the state sync: a reseed when Redis lost what this host knew."""
    now = time.time()
    if store.begin_sync(now):
        store.reseed(LocalView(usage=[], spend={}, backoffs={}, snapshots={},
                               switched_off=frozenset()), now)  # fmt: skip
    store.flush()


@pytest.mark.parametrize("lost", ["total", "total and ledger"])
def test_a_lost_day_closes_paid_until_every_live_host_put_its_own_back(redis_server, lost):
    """The day's total goes (evicted by a policy lanes was not told of, deleted, or lost by a
    failover) while the epoch stays. The reservation script notices (the day is marked as having
    reservations), rebuilds the total from what the ledger still holds and rotates the epoch; paid
    stays closed on every host until each host live before has put its own reservations back —
    never reopened on one host's partial view, never reseeded downward."""
    raw = redis.Redis.from_url(redis_server.url)
    a, b = host(redis_server.url), host(redis_server.url)
    _beat(a, b)
    today = window_id("day", time.time())
    made = [_reserve_on(a, today), _reserve_on(a, today), _reserve_on(b, today)]
    assert None not in made
    raw.delete(f"lanes:paid-total:{today}", *([f"lanes:paid:{today}"] if "ledger" in lost else []))
    with pytest.raises(StoreUnavailable, match="put its reservations back"):
        _reserve_on(a, today)  # the old code granted it against a total of 0
    with pytest.raises(StoreUnavailable):
        _reserve_on(b, today)  # the epoch moved: b knows without a sync
    _sync(a)
    with pytest.raises(StoreUnavailable, match=f"waiting for: {b.host_id}"):
        _reserve_on(a, today)  # a put its own back; b has not yet
    _sync(b)
    _sync(a)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 3 * 10**10  # all three, once each
    assert _reserve_on(a, today) is not None and _reserve_on(b, today) is not None
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 5 * 10**10


def test_after_a_flush_paid_waits_for_the_other_live_host(redis_server, caplog):
    """Redis restarts empty under two live hosts: the first to sync puts its reservations back
    and waits for the other's (said in one line), then both reopen on the whole day."""
    raw = redis.Redis.from_url(redis_server.url)
    a, b = host(redis_server.url), host(redis_server.url)
    _beat(a, b)
    today = window_id("day", time.time())
    assert _reserve_on(a, today) and _reserve_on(b, today)
    raw.flushall()
    _sync(a)
    with pytest.raises(StoreUnavailable, match=f"waiting for: {b.host_id}"):
        _reserve_on(a, today)  # the old code granted it: the day held only a's reservation
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 10**10
    _sync(b)
    _sync(a)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 2 * 10**10
    assert _reserve_on(a, today) is not None
    said = [r.getMessage() for r in caplog.records if "stays closed until" in r.getMessage()]
    assert len(said) == 1 and "a restart without persistence" in said[0]
    assert any(
        "every live host put its reservations back" in r.getMessage() for r in caplog.records
    )


def test_tls_with_the_ca_named_in_the_url(redis_server, tmp_path):
    """`rediss://…?ssl_ca_certs=` (docs/operations.md) against a real redis-server speaking TLS
    with a certificate from a throwaway CA: paid opens and the ledger is written over TLS; a
    server the named CA did not sign is refused, paid closed, nothing secret in the message."""
    import trustme

    from lanes.harness.processes import free_port
    from lanes.harness.redis_server import RedisServer

    ca, stranger = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.private_key_pem.write_to_path(str(key))
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(chain), append=i > 0)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    stranger.cert_pem.write_to_path(str(tmp_path / "stranger.pem"))
    port = free_port()
    server = RedisServer(tmp_path / "tls", None, "--tls-port", str(port), "--tls-cert-file",
                         str(chain), "--tls-key-file", str(key), "--tls-auth-clients",
                         "no").start()  # fmt: skip
    try:
        a = host(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.pem'}")
        assert is_up(a) and _reserve_on(a, window_id("day", time.time())) is not None
        assert redis.Redis(port=server.port).get(
            "lanes:paid-total:" + str(window_id("day", time.time()))
        )
        a.close()
        other = RedisStore(
            f"rediss://:sekrit@127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'stranger.pem'}",
            local=SQLiteStore(":memory:"),
        )
        with pytest.raises(StoreUnavailable) as refused:
            other.begin_sync(time.time())
        assert not is_up(other) and "sekrit" not in str(refused.value)
        other.close()
    finally:
        server.stop()


def test_a_settle_never_recreates_a_lost_total(redis_server):
    """Review of issue 41, break 1: the day's total goes while a request is in flight; its
    settlement used to recreate the total as (cost − reserved) — near zero — so the lost day was
    never noticed and the ceiling was spent again ($1.81 of $1.00). Now the total stays missing,
    the next reservation rebuilds it from the ledger and every host puts its own back first."""
    raw = redis.Redis.from_url(redis_server.url)
    a = host(redis_server.url)
    today = window_id("day", time.time())
    made = [_reserve_on(a, today) for _ in range(9)]
    raw.delete(f"lanes:paid-total:{today}")
    a.settle_paid(str(made[0]), 0.001)
    a.flush()
    assert raw.get(f"lanes:paid-total:{today}") is None  # not recreated by the settlement
    with pytest.raises(StoreUnavailable):
        _reserve_on(a, today)
    _sync(a)
    total = int(raw.get(f"lanes:paid-total:{today}") or 0)
    assert total == 8 * 10**10 + 10**9  # rebuilt from the ledger: eight held, one settled


def test_a_restart_from_an_older_snapshot_is_a_loss_every_host_answers(redis_server, tmp_path):
    """Break 2: Redis restarts from a snapshot older than b's last reservations; the epoch and
    the day's total survive, so nothing in Redis says a day was lost. b finds its own
    reservations missing and moves the epoch on; a, back from the same outage, waits until b has
    put them back — the day is never reopened short of them."""
    raw = redis.Redis.from_url(redis_server.url)
    a = host(redis_server.url, timeouts_s=0.3)
    b = host(redis_server.url, timeouts_s=0.3)
    _beat(a, b)
    today = window_id("day", time.time())
    early = [_reserve_on(a, today), _reserve_on(b, today)]
    snapshot = {k: raw.dump(k) for k in raw.keys("lanes:*")}
    late = [_reserve_on(b, today) for _ in range(3)]
    assert None not in early + late
    raw.flushall()  # the restart from the snapshot: b's last three are gone
    for key, value in snapshot.items():
        assert value is not None
        raw.restore(key, 0, value)
    for store in (a, b):
        store.up = False  # as their next call, failing on the restart, leaves them
    _sync(a)
    with pytest.raises(StoreUnavailable, match="waiting for"):
        _reserve_on(a, today)
    _sync(b)
    _sync(a)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 5 * 10**10
    assert _reserve_on(a, today) is not None


def test_a_reservation_a_replica_did_not_acknowledge_is_given_back(redis_server):
    """Break 7: with state_redis_min_replicas and no replica, a reservation is refused before it
    is sent — and given back, not left holding the day's budget."""
    raw = redis.Redis.from_url(redis_server.url)
    store = RedisStore(redis_server.url, local=SQLiteStore(":memory:"), min_replicas=1)
    store.begin_sync(time.time())
    store.flush()
    today = window_id("day", time.time())
    for _ in range(3):
        with pytest.raises(StoreUnavailable, match="replica"):
            _reserve_on(store, today)
    store.flush()
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 0


def test_a_settlement_that_is_not_a_number_can_not_stop_the_flush(redis_server):
    """Break 8: a NaN or infinite cost, or an id this host never made, used to make every flush
    raise (a kill switch set on that host never reached Redis). Now a cost that is not a finite
    number keeps the reservation, a negative one settles at 0, and an unknown id is ignored."""
    raw = redis.Redis.from_url(redis_server.url)
    a = host(redis_server.url)
    today = window_id("day", time.time())
    made = [str(_reserve_on(a, today)) for _ in range(3)]
    a.settle_paid(made[0], float("nan"))
    a.settle_paid(made[1], float("-inf"))
    a.settle_paid(made[2], -5.0)
    a.settle_paid("x", 0.0)
    a.flush()
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 2 * 10**10  # nan, inf kept; -5 → 0
    with pytest.raises(ValueError, match="finite USD amount"):
        PaidAsk(day=today, amount=-0.5, ceiling=1.0, lane="p", model="m", job="j", cohort=None)


def test_one_namespace_on_two_databases_shares_nothing(redis_server):
    """Break 6: the same state_namespace on databases 0 and 1 shared one event channel (a grant
    and a kill switch crossed over). The channel names the database too."""
    url = f"redis://127.0.0.1:{redis_server.port}"
    a = RedisStore(f"{url}/0", local=SQLiteStore(":memory:"), namespace="shop")
    b = RedisStore(f"{url}/1", local=SQLiteStore(":memory:"), namespace="shop")
    for store in (a, b):
        store.begin_sync(time.time())
        store.flush()
    assert b.listen(0.05) == []
    _acts(a, time.time())
    assert b.listen(0.3) == [] and b.grants(time.time()) == {}


def test_a_second_loss_while_waiting_puts_everything_back_again(redis_server):
    """Redis is flushed again after the hosts put theirs back but before paid reopened: every
    host, this one included, puts its own back again under the new epoch (found by the review's
    `h1`: a host that had said so once did not say so again, and its reservations stayed out)."""
    raw = redis.Redis.from_url(redis_server.url)
    a, b = host(redis_server.url), host(redis_server.url)
    _beat(a, b)
    today = window_id("day", time.time())
    assert all([_reserve_on(a, today), _reserve_on(b, today), _reserve_on(b, today)])
    raw.flushall()
    _sync(a)
    raw.flushall()  # again, before b has put its own back
    _sync(a)
    _sync(b)
    _sync(a)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 3 * 10**10
    assert _reserve_on(a, today) is not None


def test_a_host_restarted_on_an_empty_redis_waits_for_the_others_to_restart(redis_server, tmp_path):
    """Every host restarted while Redis lost its data: the first one back holds reservations of
    today in its file, so the day was not empty — it waits for the others (new ids it can not
    name) before paid reopens, and reopens on the whole day once they have put theirs back."""
    raw = redis.Redis.from_url(redis_server.url)
    files = [str(tmp_path / f"{name}.db") for name in ("a", "b")]
    first = [RedisStore(redis_server.url, local=SQLiteStore(f)) for f in files]
    today = window_id("day", time.time())
    for store in first:
        _sync(store)
        assert _reserve_on(store, today) is not None
        store.close()
    raw.flushall()
    a = RedisStore(redis_server.url, local=SQLiteStore(files[0]))
    _sync(a)
    with pytest.raises(StoreUnavailable, match="any host it can not name"):
        _reserve_on(a, today)
    b = RedisStore(redis_server.url, local=SQLiteStore(files[1]))
    _sync(b)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 2 * 10**10  # both put back


def test_after_a_loss_paid_waits_out_the_next_sync_of_hosts_it_did_not_know(redis_server):
    """Review break 5: c joined and reserved after a's last beat, then Redis was flushed; a did
    not know c, so it reopened on a day without c's reservations. Now a running host that notices
    a loss holds paid past every live host's next sync (`loss_hold_s`), and c puts its own back
    at its own."""
    raw = redis.Redis.from_url(redis_server.url)
    hold = 0.3
    a = RedisStore(redis_server.url, local=SQLiteStore(":memory:"), loss_hold_s=hold)
    _sync(a)
    b = host(redis_server.url)
    _beat(a, b)
    c = host(redis_server.url)  # after a's last beat: a does not know it
    today = window_id("day", time.time())
    assert all([_reserve_on(a, today), _reserve_on(b, today), _reserve_on(c, today)])
    raw.flushall()
    _sync(a)
    _sync(b)
    _sync(a)
    with pytest.raises(StoreUnavailable, match="any host it can not name"):
        _reserve_on(a, today)  # the old code granted it here: the day held a's and b's only
    _sync(c)
    time.sleep(hold)  # wall-clock: the hold is real time (every host syncs every 0.5 s)
    _sync(a)
    assert int(raw.get(f"lanes:paid-total:{today}") or 0) == 3 * 10**10
    assert _reserve_on(a, today) is not None
