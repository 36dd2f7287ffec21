"""Where the response cache keeps its entries, one contract over both stores — a SQLite file and a
real redis-server: served until their TTL, the oldest evicted first over the cap, a client's
cleared alone — and the library's `Job(cache=...)` on `open_dispatcher`."""

from __future__ import annotations

import trio

import lanes
from lanes._core.cache.store import Entry
from lanes.harness.configs import local_lane
from lanes.testing import open_fake

ASK = [{"role": "user", "content": "Say hi"}]


def entry(key: str, client: str = "a", made_at: float = 1000.0, size: int = 100) -> Entry:
    body = b'{"choices":[]}'.ljust(size, b" ")
    return Entry(
        key=key,
        client=client,
        made_at=made_at,
        body=body,
        lane="local",
        model="m",
        provider="llamacpp",
        route="local",
        cost_usd=0.25,
    )


def test_an_entry_is_served_until_its_ttl(entries):
    entries.put([entry("k1")], 10_000, 60.0)
    found = entries.get("k1", 1030.0, 60.0)
    assert found == entry("k1")
    assert entries.get("k1", 1061.0, 60.0) is None  # past its TTL
    assert entries.get("other", 1030.0, 60.0) is None


def test_the_oldest_go_first_over_the_cap_and_a_replaced_entry_counts_once(entries):
    for n in range(5):
        entries.put([entry(f"k{n}", made_at=1000.0 + n)], 350, 3600.0)
    assert entries.sizes() == (3, 300)
    assert [entries.get(f"k{n}", 1010.0, 3600.0) is not None for n in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    entries.put([entry("k4", made_at=1010.0, size=200)], 350, 3600.0)  # replaced, larger
    assert entries.sizes() == (2, 300)  # k2 went to make room
    assert entries.get("k2", 1010.0, 3600.0) is None


def test_a_clients_entries_are_cleared_alone(entries):
    entries.put([entry("a1", client="a")], 10_000, 3600.0)
    entries.put([entry("a2", client="a")], 10_000, 3600.0)
    entries.put([entry("b1", client="b")], 10_000, 3600.0)
    assert entries.clear("a") == 2
    assert entries.get("a1", 1001.0, 3600.0) is None
    assert entries.get("b1", 1001.0, 3600.0) is not None
    assert entries.sizes() == (1, 100)
    assert entries.clear(None) == 1
    assert entries.sizes() == (0, 0)


def library_config(tmp_path, url: str, mode: str) -> lanes.Config:
    """A library's config: one local lane at `url`, state in `tmp_path`, `[cache] mode`."""
    return lanes.load_config(
        {
            "state": str(tmp_path / "state.db"),
            "cache": {"mode": mode},
            "lanes": [local_lane("local", url)],
        },
        env={},
    )


async def test_the_library_reads_and_writes_the_cache_with_job_cache(tmp_path):
    """`open_dispatcher` with `[cache] mode = "write_only"`: answers are kept, and read by a job
    that asks (`Job(cache="on")`), whole or streamed."""
    async with open_fake("local", models=("local-model",)) as fake:
        config = library_config(tmp_path, fake.base_url, "write_only")

        def job(**kw):
            return lanes.Job(messages=ASK, params={"seed": 1}, **kw)

        async with lanes.open_dispatcher(config, env={}) as dispatcher:
            first = await dispatcher.complete(job())
            unread = await dispatcher.complete(job())
            hit = await dispatcher.complete(job(cache="on"))
            async with dispatcher.open_stream(job(cache="on")) as stream:
                pieces = [c["choices"][0]["delta"].get("content") async for c in stream]
        assert len(fake.requests()) == 2
    assert (first.cache, unread.cache, hit.cache) == ("miss", "miss", "hit")
    assert hit.route == "cache" and hit.text == first.text and hit.attempts == ()
    assert stream.route == "cache" and "".join(p or "" for p in pieces) == first.text


async def test_a_library_block_that_ends_at_once_keeps_its_last_answers(tmp_path):
    """A block that ends right after its last job (inside the writer's gathering window) still
    keeps that answer: the next block on the same state finds it (the review: it was dropped)."""
    async with open_fake("local", models=("local-model",)) as fake:
        config = library_config(tmp_path, fake.base_url, "on")
        asked = lanes.Job(messages=ASK, params={"seed": 1})
        async with lanes.open_dispatcher(config, env={}) as dispatcher:
            first = await dispatcher.complete(asked)
        async with lanes.open_dispatcher(config, env={}) as dispatcher:
            again = await dispatcher.complete(asked)
        assert len(fake.requests()) == 1
    assert (first.cache, again.cache) == ("miss", "hit")


def test_what_redis_memory_means_for_the_cache(redis_server):
    """The cache's entries share Redis' memory with the state store's keys: under `noeviction` a
    `max_mb` over half of `maxmemory` would make a full Redis refuse the ledger's writes, and
    under `volatile-ttl` the free tier's counts and backoffs go before answers — each said, naming
    the setting; no limit, or `volatile-lru`, is nothing to say. Read from a real redis-server."""
    import redis

    from lanes._core.cache.redis_entries import RedisEntries

    server = redis.Redis.from_url(redis_server.url)
    entries = RedisEntries(redis_server.url)
    try:
        notes = {}
        settings = [("0", "noeviction"), ("10mb", "noeviction"), ("10mb", "volatile-ttl")]
        for limit, policy in settings:
            server.config_set("maxmemory", limit)
            server.config_set("maxmemory-policy", policy)
            notes[limit, policy] = (entries.memory_note(4_000_000), entries.memory_note(6_000_000))
        server.config_set("maxmemory-policy", "volatile-lru")
        lru = entries.memory_note(6_000_000)
    finally:
        entries.close()
        server.close()
    assert notes["0", "noeviction"] == ("", "")  # no limit
    under, over = notes["10mb", "noeviction"]
    assert under == "" and "max_mb (6 MB)" in over and "maxmemory (10,485,760 bytes)" in over
    assert "under noeviction" in over and "the paid ledger's" in over
    assert all("volatile-ttl" in n and "backoffs" in n for n in notes["10mb", "volatile-ttl"])
    assert lru == ""


async def test_the_sidecar_says_what_redis_memory_means_for_the_cache(redis_server, caplog):
    """A dispatcher with the cache on a Redis that could not hold it says so at start."""
    import redis

    redis.Redis.from_url(redis_server.url).config_set("maxmemory", "1mb")
    async with open_fake("local", models=("local-model",)) as fake:
        config = lanes.load_config(
            {
                "state": redis_server.url,
                "cache": {"mode": "on", "max_mb": 16},
                "lanes": [local_lane("local", fake.base_url)],
            },
            env={},
        )
        async with lanes.open_dispatcher(config, env={}) as dispatcher:
            await dispatcher.complete(lanes.Job(messages=ASK, params={"seed": 1}))
            with trio.fail_after(10):  # the sweeper asks Redis in a worker thread at its start
                while True:
                    said = _said(caplog)
                    if said:
                        break
                    await trio.sleep(0.01)
    assert len(said) == 1 and "max_mb (16 MB)" in said[0], said


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "response cache: redis at" in r.getMessage()]


async def test_the_memory_note_is_said_once_a_change(caplog):
    """The sweeper says the store's memory note when it first reads it and when it changes, not
    each round it reads the same one; a store that can not say is the task's health, not a line."""
    from lanes._core.cache.cache import ResponseCache
    from lanes._core.cache.store import SQLiteEntries
    from lanes._core.config.schema import CacheConfig
    from lanes._core.runtime.tasks import Background

    class Noting(SQLiteEntries):
        note: str | Exception = "crowded"

        def memory_note(self, max_bytes: int) -> str:
            if isinstance(self.note, Exception):
                raise self.note
            return self.note

    entries = Noting(":memory:")
    health = Background().task("cache")
    cache = ResponseCache(
        CacheConfig(mode="on"), {}, entries, now_wall=lambda: 0.0, health=health, inline_reads=True
    )
    said = await cache._memory("")
    said = await cache._memory(said)  # the same note again: not said
    entries.note = OSError("refused")
    said = await cache._memory(said)  # unreadable: kept, the task's health says why
    entries.note = "crowded more"
    await cache._memory(said)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("crowded")]
    assert lines == ["crowded", "crowded more"]
    assert health.failures == 1 and "refused" in (health.failing or "")
