"""What an answer cost, as the sidecar says it: `X-Lanes-Cost-Usd` and the stream's trailer carry
the ledger's own figure, unrounded — summed over many jobs they make the report's total."""

from __future__ import annotations

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from lanes._core.freetier.prices import usd_text
from sidecar import open_sidecar

#: A cheap paid model: a short answer costs well under a millionth of a dollar.
CHEAP = {"models": [{"id": "cheap", "input_usd_per_mtok": 0.01, "output_usd_per_mtok": 0.03}]}


@given(st.floats(min_value=0.0, max_value=1e6, allow_nan=False))
def test_a_usd_figure_reads_back_as_itself(amount):
    """The text of a USD figure reads back as exactly the same float; only nothing is `0`."""
    text = usd_text(amount)
    assert float(text) == amount
    assert (text == "0") == (amount == 0)


async def _report_total(http: httpx2.AsyncClient, url: str, jobs: int) -> float:
    """The report's paid total, once the audit holds `jobs` jobs (it is flushed in the
    background)."""
    with trio.fail_after(10):
        while True:
            total = (await http.get(f"{url}/report?since=1d")).json()["total"]
            if total["jobs"] >= jobs:
                return float(total["paid_cost_usd"])
            await trio.sleep(0.05)


async def test_cost_headers_sum_to_the_reports_total(tmp_path):
    """Forty paid answers of a cheap model, plain and streamed: no header or trailer reads as
    free, each equals its job's story, and their sum is the report's total to 1e-12."""
    async with (
        open_sidecar(
            ("paid", "paid", ["cheap"], CHEAP),
            policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
            state=str(tmp_path / "state.db"),
        ) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        figures, stories = [], []
        for i in range(40):
            body = {
                "model": "paid/cheap",
                "messages": [{"role": "user", "content": "x" * (1 + 7 * i)}],
                "stream": i % 4 == 0,
            }
            response = await http.post(f"{url}/chat/completions", json=body)
            assert response.status_code == 200, response.text
            if body["stream"]:
                text = response.text.split("cost_usd=")[1].split()[0]
            else:
                text = response.headers["x-lanes-cost-usd"]
            figures.append(text)
            stories.append(response.headers["x-lanes-request-id"])
        total = await _report_total(http, url, 40)
        story_costs = [
            (await http.get(f"{url}/requests/{request_id}")).json()["cost_usd"]
            for request_id in stories
        ]
    assert all(float(f) > 0 for f in figures) and "0.000000" not in figures
    assert [float(f) for f in figures] == story_costs
    assert sum(float(f) for f in figures) == pytest.approx(total, abs=1e-12, rel=0)
    assert total < 40e-6  # cheap: six decimals would have rounded most of these to nothing
