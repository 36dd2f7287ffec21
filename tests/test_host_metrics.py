"""`/metrics` under `lanes serve --workers N` is the host's: every worker's counters added,
whichever worker answers a scrape; a counter never goes backwards while the host runs. The
tallies' sum and their file form are pure (Hypothesis); the host's totals are checked through
real processes."""

from __future__ import annotations

import json

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from lanes._core.audit import tally
from lanes._core.audit.tally import BUCKETS, Histogram, TallyStatistics
from lanes.harness.processes import open_sidecar_process
from lanes.testing import answer, open_fake

label = st.text(alphabet="abcxyz-/", max_size=6)
count = st.integers(min_value=0, max_value=10**6)


def counters(width: int, values: st.SearchStrategy[float] | st.SearchStrategy[int] = count):
    return st.dictionaries(st.tuples(*[label] * width), values, max_size=5)


histograms = st.dictionaries(
    label,
    st.builds(
        Histogram,
        counts=st.tuples(*[count] * (len(BUCKETS) + 1)),
        sum_s=st.floats(min_value=0, max_value=1e6),
    ),
    max_size=3,
)
tallies = st.builds(
    TallyStatistics,
    jobs=counters(4),
    attempts=counters(4),
    tokens=counters(5),
    cost_usd=counters(4, st.floats(min_value=0, max_value=1e6)),
    job_latency=histograms,
    attempt_latency=histograms,
)


@given(tallies)
def test_a_tally_reads_back_as_it_was_written(t):
    """What a worker writes (through JSON) is what another reads."""
    assert tally.from_json(json.loads(json.dumps(tally.to_json(t)))) == t


@given(st.lists(tallies, max_size=4))
def test_the_host_total_is_every_worker_s_counts_added(parts):
    """Each label set's total is the sum of the workers' counts for it; a histogram's buckets
    and sum add the same way."""
    total = tally.summed(parts)
    for name, _ in tally.COUNTERS:
        keys = {k for p in parts for k in getattr(p, name)}
        assert set(getattr(total, name)) == keys
        for k in keys:
            expected = sum(getattr(p, name).get(k, 0) for p in parts)
            assert getattr(total, name)[k] == pytest.approx(expected)
    for name in tally.HISTOGRAMS:
        for k, h in getattr(total, name).items():
            mine = [getattr(p, name)[k] for p in parts if k in getattr(p, name)]
            assert h.count == sum(m.count for m in mine)


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"jobs": []},
        {**tally.to_json(tally.summed([])), "jobs": [["a", "b", "c", "d", -1]]},
        {**tally.to_json(tally.summed([])), "jobs": [["a", "b", "c", 5]]},
        {**tally.to_json(tally.summed([])), "tokens": [["a", "b", "c", "d", "e", True]]},
        {**tally.to_json(tally.summed([])), "job_latency": [["r", [1, 2], 0.5]]},
        {**tally.to_json(tally.summed([])), "jobs": [["x" * 600, "b", "c", "d", 1]]},
    ],
)
def test_a_file_that_is_not_a_tally_adds_nothing(data):
    """Another process's file is untrusted: a wrong shape, a negative or boolean count, a label
    past its bound is no tally (None), never a partial one."""
    assert tally.from_json(data) is None


def requests_total(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "lanes_requests"
        for sample in family.samples
        if sample.name == "lanes_requests_total"
    )


async def scrape(base: str) -> float:
    """One scrape on a connection of its own (so the kernel may hand it to any worker)."""
    async with httpx2.AsyncClient(base_url=base, trust_env=False, timeout=30) as http:
        response = await http.get("/metrics")
        assert response.status_code == 200
        return requests_total(response.text)


@pytest.mark.slow  # a `lanes serve --workers 3` host: four processes
async def test_under_workers_every_scrape_shows_the_host_s_totals(tmp_path):
    """`--workers 3`: jobs on fresh connections land on every worker; scrapes between them never
    go backwards, and once the jobs are done every scrape — whichever worker answers — counts
    exactly the jobs sent."""
    sent = 30
    async with open_fake("local", models=("m",)) as local:
        local.script("m", answer())
        config = {
            "state": ":memory:",
            "lanes": [
                {
                    "name": "local",
                    "module": "ollama",
                    "base_url": local.base_url,
                    "models": [{"id": "m"}],
                }
            ],
        }
        async with open_sidecar_process(config, tmp_path, args=("--workers", "3")) as sidecar:
            seen: list[float] = []
            workers: set[int] = set()
            for _ in range(sent):
                async with httpx2.AsyncClient(
                    base_url=sidecar.base, trust_env=False, timeout=30
                ) as http:
                    reply = await http.post(
                        "/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "hi"}]},
                    )
                    assert reply.status_code == 200
                    workers.add((await http.get("/health")).json()["worker"])
                seen.append(await scrape(sidecar.base))
            for _ in range(150):  # every worker publishes within a second or so
                if await scrape(sidecar.base) == sent:
                    break
                await trio.sleep(0.2)
            after = [await scrape(sidecar.base) for _ in range(12)]
    assert len(workers) >= 2  # the jobs did reach more than one worker
    assert seen == sorted(seen)  # never backwards
    assert after == [sent] * 12
