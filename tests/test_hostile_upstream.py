"""An upstream that answers with garbage never takes the dispatcher down: every number bounded where
it enters, every body read only up to its cap, and the state sync alive whatever it is handed."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio

import lanes
from helpers import config, http_client, local_lane, paid_lane, sqlite_store, store_up
from lanes._core.freetier.headers import MAX_WAIT_S
from lanes._core.freetier.prices import MAX_TOKENS
from lanes._http.metrics import Metrics
from lanes.drills.hostile import gzip_bomb
from lanes.testing import ANSWER, Behaviour, answer, open_fake, rate_limited, raw
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "Say the pangram."}]
MiB = 1024 * 1024


def job(**kw) -> lanes.Job:
    return lanes.Job(messages=MESSAGES, **kw)


@pytest.fixture
async def two():
    async with (
        open_fake("sick", models=("sick-model",)) as sick,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        yield sick, paid


def completion(**extra) -> dict[str, object]:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "sick-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}}],
        **extra,
    }


@pytest.mark.parametrize(
    "usage",
    [
        pytest.param({"total_tokens": 2**64}, id="2^64"),
        pytest.param({"total_tokens": 1e300}, id="1e300"),
        pytest.param(
            {"prompt_tokens": 2**70, "completion_tokens": 1, "total_tokens": 3}, id="huge"
        ),
        pytest.param({"prompt_tokens": -5, "completion_tokens": 1e308}, id="negative"),
        pytest.param({"total_tokens": "lots"}, id="text"),
    ],
)
async def test_absurd_usage_is_bounded_before_it_is_counted(
    usage, two, env, tmp_path, autojump_clock
):
    """A usage object of 2^64, 1e300, negative or text tokens: the job is served, the count stays
    bounded, the paid ledger settles at the reservation, and the state sync never fails."""
    sick, paid = two
    sick.script("sick-model", answer(usage=usage))
    paid.script("paid-model", answer(usage=usage))
    cfg = config(
        local_lane("sick", sick.base_url, ["sick-model"]),
        paid_lane("paid", paid.base_url),
        state=str(tmp_path / "state.db"),
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        local = await dispatcher.complete(job())
        bought = await dispatcher.complete(job(model="paid/paid-model", params={"max_tokens": 10}))
        await trio.sleep(1.5)  # three syncs
        stats = dispatcher.statistics()
        counts = sqlite_store(dispatcher).records.query("SELECT MAX(count) FROM usage")
    assert local.lane == "sick" and bought.lane == "paid"
    assert bought.cost_usd == pytest.approx(bought.attempts[0].cost_usd) and bought.cost_usd > 0
    assert stats.background.failing == {} and stats.background.dropped == {}
    assert counts[0][0] <= 2 * MAX_TOKENS


@pytest.mark.parametrize("value", ["1e308", "1e20", "9" * 400, "inf", "NaN", "-1"])
async def test_an_absurd_retry_after_is_clamped_and_said_once(
    value, two, env, tmp_path, caplog_lanes, autojump_clock
):
    """Retry-After of 1e308, 1e20, 400 digits, inf, NaN or -1: the backoff is at most 7 days (plus
    jitter), the state file takes it, nothing fails, and a clamp is logged once however often (a
    value that is not a finite number is no retry-after at all)."""
    sick, paid = two
    sick.script("sick-model", rate_limited(headers={"retry-after": value}))
    cfg = config(
        local_lane("sick", sick.base_url, ["sick-model"]),
        paid_lane("paid", paid.base_url),
        state=str(tmp_path / "state.db"),
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        now = dispatcher.now_wall()
        for _ in range(3):
            dispatcher.manager.forget_backoff("sick/sick-model")
            await dispatcher.complete(job())
        await trio.sleep(0.6)
        backoff = dispatcher.manager.backoff("sick/sick-model")
        stats = dispatcher.statistics()
    assert backoff is None or backoff.until <= now + MAX_WAIT_S * 1.1 + 1
    assert stats.background.failing == {}
    clamped = [r for r in caplog_lanes.records if "out of bounds" in r.getMessage()]
    assert len(clamped) == (1 if value in ("1e308", "1e20") else 0)


async def test_an_absurd_retry_after_reaches_redis_bounded(redis_server, env, tmp_path):
    """Retry-After: 1e20 with Redis state: the backoff expires within 7 days in Redis, the store
    stays up (paid open), and the sync does not fail."""
    import redis

    async with (
        open_fake("sick", models=("sick-model",)) as sick,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        sick.script("sick-model", rate_limited(headers={"retry-after": "1e20"}))
        cfg = config(
            local_lane("sick", sick.base_url, ["sick-model"]),
            paid_lane("paid", paid.base_url),
            state=redis_server.url,
            local_state=str(tmp_path / "local.db"),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            await store_up(dispatcher, 10)
            served = await dispatcher.complete(job())
            await trio.sleep(1.2)
            stats = dispatcher.statistics()
            up = dispatcher.store.up
    ttl_ms = redis.Redis.from_url(redis_server.url).pttl("lanes:backoff:sick/sick-model")
    assert served.lane == "paid" and up and stats.background.failing == {}
    assert 0 < ttl_ms <= (MAX_WAIT_S * 1.1 + 2) * 1000


def _big(total: int, piece: int = 64 * 1024):
    def chunks():
        yield b'{"choices": [{"message": {"content": "'
        for _ in range(total // piece):
            yield b"x" * piece
        yield b'"}}]}'

    return chunks


#: Each made when its test runs (the gzip bomb is two seconds of compressing; collecting the
#: suite on every worker need not pay it), by the id the test runs under.
HOSTILE_BODIES: dict[str, Callable[[], Behaviour]] = {
    "64 MiB JSON": lambda: raw(chunks=_big(64 * MiB)),
    "gzip bomb": lambda: raw(body=gzip_bomb(256 * MiB), headers={"content-encoding": "gzip"}),
    "declared too long": lambda: raw(body=b"x" * (2 * MiB)),
    "NaN": lambda: raw(body=json.dumps(completion()).replace("0", "NaN", 1).encode()),
    "nested 5000 deep": lambda: raw(body=b"[" * 5000 + b"]" * 5000),
    "surrogate": lambda: raw(
        body=json.dumps(completion(x="S")).replace('"S"', '"\\ud800"').encode()
    ),
    "64 MiB error body": lambda: raw(503, chunks=_big(64 * MiB)),
}


@pytest.mark.parametrize("hostile", HOSTILE_BODIES)
async def test_hostile_bodies_are_faults_read_only_to_the_cap(hostile, two, env, autojump_clock):
    """A body over the cap (plain, chunked or a gzip bomb), NaN, absurd nesting or a lone surrogate:
    the attempt is a fault after at most the cap is read, and the next lane serves."""
    sick, paid = two
    sick.script("sick-model", HOSTILE_BODIES[hostile]())
    cfg = config(
        local_lane("sick", sick.base_url, ["sick-model"], max_response_bytes=MiB),
        paid_lane("paid", paid.base_url),
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        reply = await dispatcher.complete(job())
    first = reply.attempts[0]
    assert reply.lane == "paid" and first.outcome == "fault"
    assert first.category in ("too_large", "malformed", "server_error"), first


def _event_stream(*events: bytes):
    def chunks():
        yield from events

    return chunks


SSE = {"content-type": "text/event-stream"}


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(_event_stream(b"data: " + b"x" * (512 * 1024) + b"\n\n"), id="one big event"),
        pytest.param(_event_stream(*[b"y" * 65536] * 32), id="a line that never ends"),
        pytest.param(
            _event_stream(*[b"data: " + b"z" * 60000 + b"\n"] * 20, b"\n"), id="many data lines"
        ),
    ],
)
async def test_a_stream_event_over_the_cap_is_a_fault(chunks, two, env, autojump_clock):
    """One SSE event (or one line) larger than `max_event_bytes`: the stream is a fault before its
    first chunk, and the next lane serves the stream."""
    sick, paid = two
    sick.script("sick-model", raw(headers=SSE, chunks=chunks))
    cfg = config(
        local_lane("sick", sick.base_url, ["sick-model"], max_event_bytes=256 * 1024),
        paid_lane("paid", paid.base_url),
    )
    async with (
        lanes.open_dispatcher(cfg, env=env) as dispatcher,
        dispatcher.open_stream(job()) as stream,
    ):
        text = "".join(
            [c["choices"][0]["delta"].get("content") or "" async for c in stream if c["choices"]]
        )
        attempts = stream.attempts
    assert text == ANSWER and stream.lane == "paid"
    assert attempts[0].category == "too_large"


async def test_the_sync_drops_a_poison_batch_and_carries_on(
    env, tmp_path, autojump_clock, caplog_lanes
):
    """A store that refuses part of a batch (not an outage): what it refused is dropped and
    counted, never retried, one line says so, the task shows as failing meanwhile — what went in
    stays in once — and the next batch goes in whole."""
    async with open_fake("local", models=("local-model",)) as local:
        cfg = config(local_lane("local", local.base_url), state=str(tmp_path / "state.db"))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            store = sqlite_store(dispatcher)
            real = store.add_usage

            def poison(rows, spend):
                raise OverflowError("Python int too large to convert to SQLite INTEGER")

            store.add_usage = poison  # type: ignore[method-assign]
            for _ in range(3):
                await dispatcher.complete(job())
                await trio.sleep(0.6)
            failing = dispatcher.statistics().background.failing
            metrics = Metrics(dispatcher.statistics).render().decode()
            store.add_usage = real  # type: ignore[method-assign]
            await dispatcher.complete(job())
            await trio.sleep(0.6)
            after = dispatcher.statistics().background
            audited = store.records.query("SELECT COUNT(*) FROM audit")[0][0]
            requests = store.records.query(
                "SELECT SUM(count) FROM usage WHERE dimension = 'requests' AND window = 'day' "
                "AND scope = 'local/local-model'"
            )[0][0]
    assert "state sync" in failing and "refused a batch" in failing["state sync"]
    assert 'lanes_task_failing{task="state sync"} 1' in metrics
    assert 'lanes_dropped_total{queue="poison batches"} 3' in metrics
    assert after.failing == {} and after.dropped["poison batches"] == 3
    assert audited == 4  # written before the usage was refused: in once, never dropped
    assert requests == 1  # the three refused usage batches were dropped, the fourth went in
    lines = [r.getMessage() for r in caplog_lanes.records if "refused a batch" in r.getMessage()]
    assert len(lines) == 1, lines


async def test_audit_rows_wait_in_a_bounded_queue_while_the_disk_is_full(
    env, tmp_path, autojump_clock, caplog_lanes, monkeypatch
):
    """The store can not write (disk full) for a long while: audit rows wait in a bounded queue,
    the oldest dropped and counted, one line for the outage; when it recovers, what is left goes
    in."""
    import sqlite3

    from lanes._core.audit import journal

    monkeypatch.setattr(journal, "MAX_ROWS", 5)
    async with open_fake("local", models=("local-model",)) as local:
        cfg = config(local_lane("local", local.base_url), state=str(tmp_path / "state.db"))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            store = sqlite_store(dispatcher)
            real = store.records.add_audit

            def full(rows):
                raise sqlite3.OperationalError("database or disk is full")

            store.records.add_audit = full  # type: ignore[method-assign]
            for _ in range(20):
                await dispatcher.complete(job())
                await trio.sleep(0.3)
            waiting = len(dispatcher.take_audit_rows())
            store.records.add_audit = real  # type: ignore[method-assign]
            await trio.sleep(0.6)
            stats = dispatcher.statistics().background
    assert waiting <= 5 and stats.dropped["audit rows"] >= 15
    assert stats.failing == {}
    outage = [r for r in caplog_lanes.records if "disk is full" in r.getMessage()]
    assert len(outage) == 1


async def test_unreadable_events_from_other_hosts_are_dropped_and_counted(env, autojump_clock):
    """Messages another host published that can not be read change nothing and are counted."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        lanes.open_dispatcher(config(local_lane("local", local.base_url)), env=env) as d,
    ):
        sync = d._sync  # the dispatcher's own: what another host publishes reaches it
        bad = {"t": "backoff", "scope": "x", "s": 1, "r": "rate_limited", "o": ""}
        sync.apply(
            [
                {**bad, "u": 1e308},
                {**bad, "u": "NaN"},
                {**bad, "u": 10**400, "r": "nope"},
                {"t": "probe", "scope": ["a"], "ok": True},
                {"t": "switch"},
                {"t": 7},
            ]
        )
        stats = d.statistics().background
    assert stats.dropped["unreadable events"] == 6
    assert d.manager.backoff("x") is None


async def test_a_catalog_that_breaks_the_refresh_never_kills_it(env, autojump_clock, caplog_lanes):
    """A model list that makes the refresh raise something unexpected: the task reports it (in the
    statistics, one line), keeps routing to the configured models, and tries again later."""
    async with open_fake("local", models=("local-model",)) as local:
        local.catalog = [{"id": "m", "object": "model"}]
        cfg = config(local_lane("local", local.base_url, discover=True, catalog_refresh_s=5))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            lane = dispatcher.lanes["local"]

            def broken() -> None:
                raise RuntimeError("a bug in the catalog code")

            lane._rebuild = broken  # type: ignore[method-assign]
            await trio.sleep(12)
            failing = dispatcher.statistics().background.failing
            reply = await dispatcher.complete(job())
    assert "catalog local" in failing and "RuntimeError" in failing["catalog local"]
    assert reply.lane == "local" and local.catalog_requests >= 2
    lines = [r for r in caplog_lanes.records if "a bug in the catalog code" in r.getMessage()]
    assert len(lines) == 1
    assert all(r.levelno == logging.WARNING for r in lines) and time.time()


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
        async with http_client() as http:
            body: dict[str, Any] = (
                {"model": "odd/b", "max_tokens": 5, "messages": MESSAGES}
                if door == "/v1/messages"
                else {"model": "odd/b", "input": "hi"}
            )
            response = await http.post(url.removesuffix("/v1") + door, json=body)
    assert response.status_code != 500, response.text
    assert response.headers["content-type"].startswith("application/json")
