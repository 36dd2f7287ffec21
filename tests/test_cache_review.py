"""The response cache under a hostile review: what a hostile client, a broken upstream or an
operator could make it do that it must not — each test failed before its fix."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from test_cache_entries import entry

import lanes
from lanes._core.cache.store import SQLiteEntries
from lanes.testing import raw
from sidecar import open_sidecar

LOCAL = ("local", "local", ["local-model"])
ASK: Any = [{"role": "user", "content": "Say hi"}]
ON = {"mode": "on"}


async def chat(url: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        return await http.post(f"{url}/chat/completions", json=body, headers=headers)


def asked(**more: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": ASK, "temperature": 0, **more}


async def test_a_200_whose_choice_says_error_is_never_stored():
    """OpenRouter's way of failing inside a 200: the choice's `finish_reason` is `error`, with the
    error beside it — an answer to pass on, never one to serve again for a day."""
    failed = {
        "id": "gen-1",
        "object": "chat.completion",
        "model": "local-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The quick"},
                "finish_reason": "error",
                "error": {"code": 502, "message": "Provider disconnected"},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", raw(200, json.dumps(failed).encode()))
        await chat(url, asked())
        fakes["local"].script("local-model")
        again = await chat(url, asked())
        assert len(fakes["local"].requests()) == 2
    assert again.headers["x-lanes-cache"] == "miss"
    assert again.json()["choices"][0]["finish_reason"] == "stop"


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


async def test_a_stream_whose_choice_ends_in_error_is_never_stored():
    """The same inside a stream: the last chunk's choice ends with `error` (and says it), no
    top-level error — the reader passes it on as a finish, the cache must not keep it."""
    head = {"id": "gen-1", "object": "chat.completion.chunk", "model": "local-model"}
    body = _sse(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The"}}]},
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": ""},
                    "finish_reason": "error",
                    "error": {"code": 502, "message": "Provider disconnected"},
                }
            ],
        },
    )
    streamed = raw(200, body, headers={"content-type": "text/event-stream"})
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", streamed)
        await chat(url, asked(stream=True))
        fakes["local"].script("local-model")
        again = await chat(url, asked())
        assert len(fakes["local"].requests()) == 2
    assert again.headers["x-lanes-cache"] == "miss"


async def test_the_sections_off_keeps_the_cache_off_for_a_client_that_says_on():
    """`[cache] mode = "off"` is the operator's word for every client (the config reference says
    so): a client's own `cache = "on"` must not turn storing answers back on for it."""
    server = {"clients": {"a": {"key_env": "KEY_A", "cache": "on"}}}
    env = {"KEY_A": "client-a-key-0123456789"}
    a = {"Authorization": f"Bearer {env['KEY_A']}"}
    async with open_sidecar(LOCAL, cache={"mode": "off"}, server=server, env=env) as (url, fakes):
        first = await chat(url, asked(), **a)
        second = await chat(url, asked(), **a)
        assert len(fakes["local"].requests()) == 2
    assert "x-lanes-cache" not in first.headers and "x-lanes-cache" not in second.headers


async def test_an_answer_made_with_a_clients_own_provider_key_needs_that_key():
    """An answer a request's own provider key (`X-Lanes-Key-<lane>`) paid for, from a model that
    key may reach, is that key's: the same client key without it (or with another) does not get
    it from the cache — the provider key is used "for that job only" — while the same key does."""
    own = ("own", "free", ["own-model"], {"byok": True})
    mine, theirs = "sk-own-key-0123456789abcdef", "sk-other-key-0123456789abcd"
    async with open_sidecar(own, cache=ON) as (url, fakes):
        made = await chat(url, asked(), **{"X-Lanes-Key-own": mine})
        keyless = await chat(url, asked())
        other = await chat(url, asked(), **{"X-Lanes-Key-own": theirs})
        again = await chat(url, asked(), **{"X-Lanes-Key-own": mine})
        sent = len(fakes["own"].requests())
    assert made.headers["x-lanes-route"] == "byok"
    assert keyless.status_code != 200  # no lane it may use: not the other key's answer
    assert other.headers["x-lanes-cache"] == "miss"
    assert again.headers["x-lanes-cache"] == "hit"
    assert sent == 2


def _entry(key: str, client: str = "a", made_at: float = 1000.0) -> Any:
    return entry(key, client, made_at)  # the store contract's


def test_entries_past_their_ttl_are_deleted_a_few_at_a_time(entries):
    """The security page says an entry goes after `ttl_s`: a SQLite file kept every answer past it
    until the cap evicted it (for ever, on a quiet cache), and Redis kept its bookkeeping (the
    client's keys, the total) after Redis expired the answer. `expire` deletes those made before a
    moment, at most `limit` a call (no store is held long), with what is kept beside them."""
    for n in range(5):
        entries.put([_entry(f"k{n}", made_at=1000.0 + n)], 10_000, 3600.0)
    entries.put([_entry("b1", client="b", made_at=2000.0)], 10_000, 3600.0)
    assert entries.expire(1003.0, 3) == 3  # k0, k1, k2: the oldest first
    assert entries.expire(1003.0, 3) == 1  # k3
    assert entries.expire(1003.0, 3) == 0
    assert entries.sizes() == (2, 200)
    assert entries.get("k4", 1004.0, 3600.0) is not None
    assert entries.clear("a") == 1  # k4 alone is left of a's
    assert entries.sizes() == (1, 100)


def test_an_entry_redis_expired_leaves_nothing_behind_when_it_is_evicted(redis_server):
    """Redis expires an entry's answer on its own; when its turn to be evicted comes, its client's
    set of keys must lose it too (it kept every key ever made for the client, growing for ever)."""
    import time

    from lanes._core.cache.redis_entries import RedisEntries

    store = RedisEntries(redis_server.url, namespace="t2")
    try:
        store.put([_entry("old", made_at=1000.0)], 10_000, 0.05)  # Redis drops it in 50 ms
        time.sleep(0.2)  # wall-clock: Redis's own expiry
        store.put([_entry("new", made_at=1001.0)], 150, 3600.0)  # over the cap: "old" goes
        members = store._r.smembers("lanes:{t2}:cache:c:a")
    finally:
        store.close()
    assert members == {b"new"}


async def test_the_sweeper_deletes_a_days_answers_past_their_ttl_in_turns(tmp_path):
    """`expired()` (the sweeper's round): every entry made more than `ttl_s` ago goes, in turns of
    `SWEEP_BATCH`, and a younger one stays."""
    from lanes._core.cache import cache as response_cache
    from lanes._core.config.schema import CacheConfig
    from lanes._core.runtime.tasks import Background

    now = [1000.0]
    store = SQLiteEntries(str(tmp_path / "state.db.cache"))
    cache = response_cache.ResponseCache(
        CacheConfig(mode="on", ttl_s=60.0),
        {},
        store,
        now_wall=lambda: now[0],
        health=Background().task("cache"),
        inline_reads=True,
    )
    old = [_entry(f"k{n}", made_at=900.0 + n / 1000) for n in range(response_cache.SWEEP_BATCH + 5)]
    store.put([*old, _entry("young", made_at=990.0)], 10**9, 60.0)
    try:
        assert await cache.expired() == response_cache.SWEEP_BATCH + 5
        assert store.sizes() == (1, 100)
        assert store.get("young", 1000.0, 60.0) is not None
    finally:
        store.close()


def test_cache_control_is_read_whole():
    """A `no-store` after 256 characters of other directives is still the client's word (the
    value was cut at 256 before reading it: its answer was stored); the server bounds a header's
    size already."""
    from lanes._http.validation import cache_directive

    long = "max-age=0, " + ", ".join(f"x-directive-{n}=1" for n in range(30))
    assert cache_directive({"cache-control": f"{long}, no-store"}) == "off"
    assert cache_directive({"cache-control": f"{long}, No-Cache"}) == "refresh"
    assert cache_directive({"cache-control": "no-store, no-cache"}) == "off"
    assert cache_directive({"cache-control": 'private="no-store"'}) is None


@pytest.mark.parametrize(
    "body",
    [
        # the first version's entry: the completion itself, with no `completion` around it
        b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":'
        b'"assistant","content":"hi"},"finish_reason":"stop"}]}',
        b'{"completion": {"choices": []}}',  # not a whole answer
        b'{"completion": {"choices": [{"index": 0, "message": {"role": "assistant", "content": '
        b'"hi"}, "finish_reason": "stop"}]}, "stream": ["{not json"]}',  # a damaged chunk
        b"\x00garbage",
    ],
    ids=["older-version", "not-whole", "damaged-chunk", "garbage"],
)
async def test_an_entry_this_version_can_not_give_back_is_a_miss_not_an_error(tmp_path, body):
    """A store that fails is a miss, never an error — an entry that can not be given back too
    (another version's format, a damaged one): it answered 500 to every request for it."""
    import sqlite3

    import trio

    state = str(tmp_path / "state.db")

    async def damaged() -> None:
        await trio.sleep(0.3)  # the writer's turn (it gathers answers for 50 ms)
        with sqlite3.connect(state + ".cache") as db:
            assert db.execute("UPDATE cache_entry SET body = ?", (body,)).rowcount == 1

    async with open_sidecar(LOCAL, cache=ON, state=state) as (url, fakes):
        await chat(url, asked())
        await damaged()
        whole = await chat(url, asked())
        await damaged()  # the miss kept a fresh answer: damaged again
        streamed = await chat(url, asked(stream=True))
        sent = len(fakes["local"].requests())
    assert (whole.status_code, streamed.status_code) == (200, 200)
    assert streamed.headers["x-lanes-cache"] == "miss"
    if b"stream" in body:  # its completion can still be given back whole
        assert (whole.headers["x-lanes-cache"], sent) == ("hit", 2)
    else:
        assert (whole.headers["x-lanes-cache"], sent) == ("miss", 3)


def test_a_client_can_not_be_named_as_the_admin_key_is_unless_an_admin():
    """The admin key's jobs are client `admin`: a non-admin client of that name would share its
    cache entries (a hit on the admin's answers), its paid ceiling and its audit rows. Refused at
    check; an `admin = true` client of that name acts as an admin anyway."""
    from lanes import load_config
    from lanes._core.check import check_config
    from lanes._core.model.errors import ConfigError

    def config(admin: bool) -> Any:
        clients = {"admin": {"key_env": "KEY_X", "admin": admin}}
        server = {"clients": clients, "admin_key_env": "ADMIN_KEY"}
        return load_config({"server": server, "cache": ON}, env={})

    with pytest.raises(ConfigError, match=r"server\.clients\.admin"):
        check_config(config(admin=False), env={})
    check_config(config(admin=True), env={})


class _SlowEntries:
    """Entries in memory whose `put` waits (in its worker thread) until the test lets it go."""

    where = "memory"

    def __init__(self) -> None:
        import threading

        self.kept: dict[str, Any] = {}
        self.writing = threading.Event()
        self.go = threading.Event()

    def get(self, key: str, now: float, ttl_s: float) -> Any:
        return self.kept.get(key)

    def put(self, entries: list[Any], max_bytes: int, ttl_s: float) -> None:
        self.writing.set()
        self.go.wait(10)
        self.kept.update({e.key: e for e in entries})

    def expire(self, before: float, limit: int) -> int:
        return 0

    def clear(self, client: str | None) -> int:
        gone = [k for k, e in self.kept.items() if client is None or e.client == client]
        for key in gone:
            del self.kept[key]
        return len(gone)

    def sizes(self) -> tuple[int, int]:
        return len(self.kept), 0

    def memory_note(self, max_bytes: int) -> str:
        return ""

    def close(self) -> None:
        pass


async def test_a_clear_while_the_writer_writes_leaves_nothing_of_the_client():
    """`lanes cache clear --client a` while the writer is storing one of a's answers (Redis: the
    write is in a worker thread): the clear must not run between the writer's look at what was
    cleared and its write, or the answer it deletes is written just after — and kept for a day."""
    import time

    import trio

    import lanes
    from lanes._core.cache.cache import ResponseCache, Served
    from lanes._core.config.schema import CacheConfig
    from lanes._core.runtime.tasks import Background

    store = _SlowEntries()
    cache = ResponseCache(
        CacheConfig(mode="on"),
        {},
        store,
        now_wall=time.time,  # wall-clock: what the cache stamps entries with
        health=Background().task("cache"),
        inline_reads=False,
    )
    job = lanes.Job(messages=ASK, params={"seed": 1}, client="a")
    answer = {"role": "assistant", "content": "hi"}
    body = {"choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
    served = Served("local", "m", "llamacpp", "local")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cache.run)
        assert cache.keep(job, cache.key(job), {"completion": body}, served)
        await trio.to_thread.run_sync(store.writing.wait)  # the writer is in its put

        async def clear() -> None:
            await cache.clear("a")

        nursery.start_soon(clear)
        await trio.sleep(0.2)  # the clear has had every chance to run
        store.go.set()
        await cache.settled()
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert store.kept == {}


def test_a_lowered_cap_is_reached_over_several_writes_never_one_long_one(entries):
    """After `max_mb` is lowered (a reload), the first write evicted everything over it at once:
    100 000 entries held the SQLite writer — inline, on the event loop — 5.6 s, and 50 000 held
    Redis (every host's ledger with it) 0.96 s in one script. A write evicts at most
    `EVICT_AT_MOST` entries; the writes after it take the rest."""
    from lanes._core.cache.store import EVICT_AT_MOST

    many = EVICT_AT_MOST * 2 + 10
    entries.put([_entry(f"k{n}", made_at=1000.0 + n) for n in range(many)], 10**9, 3600.0)
    entries.put([_entry("new1", made_at=5000.0)], 100, 3600.0)
    assert entries.sizes()[0] == many + 1 - EVICT_AT_MOST
    entries.put([_entry("new2", made_at=5001.0)], 100, 3600.0)
    entries.put([_entry("new3", made_at=5002.0)], 100, 3600.0)
    assert entries.sizes() == (1, 100)  # under the cap again: the newest alone
    assert entries.get("new3", 5002.0, 3600.0) is not None


async def test_lanes_cache_clear_deletes_what_an_earlier_config_stored_once_the_cache_is_off(
    tmp_path,
):
    """The operator turns the cache off (a reload, a restart) and then asks to delete what it
    stored: `lanes cache clear` answered 409 "off here", and the SQLite file kept every answer
    for ever (no sweeper runs while the cache is off). With the cache off it clears what is left."""
    import sqlite3

    import trio

    state = str(tmp_path / "state.db")
    async with open_sidecar(LOCAL, cache=ON, state=state) as (url, _):
        await chat(url, asked())
        await trio.sleep(0.3)  # the writer's turn
    with sqlite3.connect(state + ".cache") as db:
        assert db.execute("SELECT COUNT(*) FROM cache_entry").fetchone()[0] == 1
    async with (
        open_sidecar(LOCAL, state=state) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        cleared = await http.post(f"{url}/cache/clear", json={})
        again = await http.post(f"{url}/cache/clear", json={"client": "anonymous"})
    assert cleared.status_code == 200, cleared.text
    assert cleared.json() == {"deleted": 1, "client": None}
    assert again.json() == {"deleted": 0, "client": "anonymous"}
    with sqlite3.connect(state + ".cache") as db:
        assert db.execute("SELECT COUNT(*) FROM cache_entry").fetchone()[0] == 0


async def test_a_clear_with_the_cache_off_makes_no_file(tmp_path):
    state = str(tmp_path / "state.db")
    async with (
        open_sidecar(LOCAL, state=state) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        cleared = await http.post(f"{url}/cache/clear", json={})
    assert cleared.json() == {"deleted": 0, "client": None}
    assert not (tmp_path / "state.db.cache").exists()


async def test_a_redis_that_stalls_costs_a_request_little_and_the_next_ones_nothing(redis_server):
    """Redis paused (a failover, a fork's stall): the rest of lanes serves on this host's view at
    once, but every cacheable request waited the state store's 2 s timeout for its cache read
    before being served as a miss. A read gives up within half a second, and after one fails
    the next requests do not read for a few seconds (misses at once)."""
    import time

    import redis
    import trio

    shared = {"cache": ON, "state": redis_server.url, "state_namespace": "p"}
    async with open_sidecar(LOCAL, **shared) as (url, _):
        await chat(url, asked())
        paused = redis.Redis.from_url(redis_server.url)
        paused.execute_command("CLIENT", "PAUSE", "4000", "ALL")
        paused.close()
        took = []
        for n in range(3):
            start = time.perf_counter()  # wall-clock: what the client waits
            answer = await chat(url, asked(messages=[{"role": "user", "content": f"other {n}"}]))
            took.append(time.perf_counter() - start)  # wall-clock
            assert (answer.status_code, answer.headers["x-lanes-cache"]) == (200, "miss")
        await trio.sleep(4)  # Redis back: the writer's own retries are not the test's
    assert took[0] < 1.0, took
    assert max(took[1:]) < 0.3, took


async def test_an_answer_made_by_a_model_the_canary_quarantined_is_not_served(tmp_path):
    """The canary quarantines a free model whose answers went quietly worse under the same name;
    the answers it made before the canary noticed are exactly those — the cache served them for
    a day after routing stopped sending it anything."""
    from lanes.harness.configs import FREE_KEY, free_lane
    from lanes.testing import open_fake

    async with open_fake("free", models=("free-model",)) as fake:
        config = lanes.load_config(
            {
                "state": str(tmp_path / "state.db"),
                "cache": ON,
                "lanes": [free_lane("free", fake.base_url)],
            },
            env={},
        )
        job = lanes.Job(messages=ASK, params={"seed": 1})
        async with lanes.open_dispatcher(config, env={"FREE_API_KEY": FREE_KEY}) as dispatcher:
            made = await dispatcher.complete(job)
            dispatcher.quarantine({"free/free-model": "drifted: the canary's answers moved"})
            with pytest.raises(lanes.JobFailed):  # nothing may answer it now: not the old answer
                await dispatcher.complete(job)
            dispatcher.quarantine({})
            again = await dispatcher.complete(job)
    assert (made.cache, again.cache) == ("miss", "hit")


def test_a_tool_call_index_from_upstream_never_sizes_what_the_cache_puts_together():
    """A stream's own indexes must never size anything (`ToolIndexes` keeps to it): the cache's
    assembler grew its list of calls up to a delta's `index` — one 150-byte chunk with index
    2,000,000 took 3 s and 800 MB (10**8: the process killed) — and a negative one raised
    IndexError inside the stream. Such a stream is simply not kept."""
    import time

    from lanes._core.cache.rules import Assembler

    for index in (2_000_000, -1, 1):  # (not 10**8 here: it would take the machine down)
        kept = Assembler(1024 * 1024)
        call = {"index": index, "id": "c", "type": "function", "function": {"name": "f"}}
        chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
        start = time.perf_counter()  # wall-clock: how long one chunk takes
        kept.add(chunk, None)
        assert time.perf_counter() - start < 0.5  # wall-clock
        assert kept.failed, index  # 1 with no call 0 before it: a gap, not kept either


async def test_a_stream_with_a_negative_tool_call_index_is_relayed_whole():
    head = {"id": "gen-1", "object": "chat.completion.chunk", "model": "local-model"}
    call = {"index": -1, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    body = _sse(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    streamed = raw(200, body, headers={"content-type": "text/event-stream"})
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", streamed)
        answered = await chat(url, asked(stream=True))
    assert answered.status_code == 200
    assert answered.text.rstrip().endswith("data: [DONE]"), answered.text[-300:]
