"""Jobs, replies and the synchronous door."""

from __future__ import annotations

import threading

import pytest
import trio

import lanes
from lanes.testing.fakes import open_fake
from helpers import PAID_KEY, config, local_lane
from lanes._core.job import Candidate, cost_usd, route_for


def test_job_validation():
    """Empty messages, messages without a role and a non-positive deadline are refused."""
    with pytest.raises(ValueError, match="at least one message"):
        lanes.Job(messages=[])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        lanes.Job(messages=[{"content": "x"}])
    with pytest.raises(ValueError, match="deadline_s must be > 0"):
        lanes.Job(messages=[{"role": "user", "content": "x"}], deadline_s=0)


def test_body_passes_params_through_and_sets_the_model():
    """The upstream body carries the caller's params untouched, with the chosen model."""
    job = lanes.Job(messages=[{"role": "user", "content": "x"}], params={"tools": [1], "model": "ignored", "n": 2})
    body = job.body("m", stream=True)
    assert body == {"tools": [1], "n": 2, "model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


def test_routes_and_costs():
    """Local is `local`; the first free attempt is `primary`, later ones `free_retry`; paid costs."""
    assert [route_for("local", 0), route_for("free", 0), route_for("free", 1), route_for("paid", 3)] == [
        "local", "primary", "free_retry", "paid_fallback"]
    paid = Candidate(lane="p", model="m", tier="paid", input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    assert cost_usd(paid, {"prompt_tokens": 1_000_000, "completion_tokens": 500_000}) == pytest.approx(2.0)
    assert cost_usd(Candidate(lane="f", model="m", tier="free"), {"prompt_tokens": 10}) == 0.0
    assert cost_usd(paid, {"prompt_tokens": "junk"}) == 0.0


def test_fingerprint_is_a_hash_not_the_body():
    """A job's fingerprint is a SHA-256 and a byte count, never the text."""
    job = lanes.Job(messages=[{"role": "user", "content": "secret plans"}])
    sha, size = job.fingerprint()
    assert len(sha) == 64 and size > 0 and "secret" not in sha


def test_complete_sync_serves_callers_outside_trio():
    """complete_sync runs its own trio loop: a plain thread gets a reply from a fake provider."""
    ready, stop, box = threading.Event(), threading.Event(), {}

    async def serve() -> None:
        async with open_fake("local", models=("local-model",)) as fake:
            box["url"] = fake.base_url
            ready.set()
            while not stop.is_set():
                await trio.sleep(0.01)

    thread = threading.Thread(target=trio.run, args=(serve,))
    thread.start()
    try:
        assert ready.wait(10)
        reply = lanes.complete_sync(config(local_lane("local", box["url"])),
                                    lanes.Job(messages=[{"role": "user", "content": "hi"}], deadline_s=10),
                                    env={"PAID_API_KEY": PAID_KEY})
    finally:
        stop.set()
        thread.join(10)
    assert reply.lane == "local" and reply.text.startswith("The quick brown fox")


def test_complete_sync_refuses_an_absolute_deadline():
    """An absolute deadline from another trio run is meaningless here, so it is refused."""
    with pytest.raises(ValueError, match="deadline_s"):
        lanes.complete_sync(config(), lanes.Job(messages=[{"role": "user", "content": "x"}], deadline_at=5.0))
