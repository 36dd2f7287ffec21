"""Jobs, replies and the synchronous door."""

from __future__ import annotations

import threading

import pytest
import trio

import lanes
from helpers import PAID_KEY, config, local_lane
from lanes._core.freetier.prices import usage_cost
from lanes._core.model.candidates import Candidate
from lanes._core.model.clocks import TrioTime
from lanes._core.model.record import JobRecord
from lanes.harness.processes import free_port
from lanes.testing import open_fake


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
    job = lanes.Job(
        messages=[{"role": "user", "content": "x"}],
        params={"tools": [1], "model": "ignored", "n": 2},
    )
    body = job.body("m", stream=True)
    assert body == {
        "tools": [1],
        "n": 2,
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
    }


def test_routes_and_costs():
    """Local is `local`; the first free candidate is `primary` (its same-candidate retry too),
    another free one `free_retry`; paid is `paid_fallback`; a paid answer costs its usage at its
    prices."""
    record = JobRecord(
        lanes.Job(messages=[{"role": "user", "content": "x"}]),
        deadline_at=TrioTime(10.0),
        started_at=TrioTime(0.0),
    )
    local, a, b = (
        Candidate(lane="l", model="m", tier="local"),
        Candidate(lane="a", model="m", tier="free"),
        Candidate(lane="b", model="m", tier="free"),
    )
    paid = Candidate(
        lane="p", model="m", tier="paid", input_usd_per_mtok=1.0, output_usd_per_mtok=2.0
    )
    assert [record.route_for(local), record.route_for(a)] == ["local", "primary"]
    record.record(a, "fault", route="primary", duration_s=0.1)
    assert [record.route_for(a), record.route_for(b), record.route_for(paid)] == [
        "primary",
        "free_retry",
        "paid_fallback",
    ]
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 500_000}
    assert usage_cost(usage, paid.input_usd_per_mtok, paid.output_usd_per_mtok) == pytest.approx(
        2.0
    )
    assert usage_cost({"prompt_tokens": "junk", "completion_tokens": 1}, 1.0, 2.0) is None


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
            while not stop.is_set():  # noqa: ASYNC110  a threading.Event set from another thread
                await trio.sleep(0.01)

    thread = threading.Thread(target=trio.run, args=(serve,))
    thread.start()
    try:
        assert ready.wait(10)
        reply = lanes.complete_sync(
            config(local_lane("local", box["url"])),
            lanes.Job(messages=[{"role": "user", "content": "hi"}], deadline_s=10),
            env={"PAID_API_KEY": PAID_KEY},
        )
    finally:
        stop.set()
        thread.join(10)
    assert reply.lane == "local" and reply.text.startswith("The quick brown fox")


def test_complete_sync_refuses_an_absolute_deadline():
    """An absolute deadline from another trio run is meaningless here, so it is refused."""
    with pytest.raises(ValueError, match="deadline_s"):
        lanes.complete_sync(
            config(), lanes.Job(messages=[{"role": "user", "content": "x"}], deadline_at=5.0)
        )


def test_complete_sync_raises_the_job_failure_itself():
    """A failed job leaves complete_sync (and open_dispatcher) as a JobFailed subclass, no group."""
    port = free_port()  # nothing listens there: every attempt is refused
    with pytest.raises(lanes.NoLaneAvailable) as caught:
        lanes.complete_sync(
            config(local_lane("local", f"http://127.0.0.1:{port}/v1")),
            lanes.Job(messages=[{"role": "user", "content": "hi"}], deadline_s=10),
            env={},
        )
    assert type(caught.value) is lanes.NoLaneAvailable
    assert "local/local-model: ConnectError" in str(caught.value) and caught.value.request_id
