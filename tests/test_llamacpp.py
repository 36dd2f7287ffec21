"""What lanes makes of a real llama.cpp `llama-server`, from its recorded bytes
(`tests/corpus/llamacpp`, made by `record.py` there): through `lanes serve` on loopback, a fake
replaying each answer verbatim in front of the `llamacpp` lane module. (Its plain and
streamed answers and tool calls are relayed by `tests/test_corpus.py`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
from trio.testing import MockClock

from lanes.testing import open_fake, replay

RECORDED = Path(__file__).parent / "corpus" / "llamacpp"
MODEL = "tiny-random"  # what the recorded server called its model (`--alias`)
STREAM = (RECORDED / "text.stream.http").read_bytes()
ASK: list[Any] = [{"role": "user", "content": "Say hello."}]
#: Under the autojump clock, trio's time jumps only once everything has waited this long in real
#: time while a request is in flight (a jump then could take time past a timeout).
STEADY_S = 0.25


@pytest.fixture
def clock(autojump_clock: MockClock) -> MockClock:
    """The autojump clock, jumping only after `STEADY_S` of real time with nothing to do."""
    autojump_clock.autojump_threshold = STEADY_S
    return autojump_clock


async def test_a_recorded_stream_is_replayed_event_by_event(clock):
    """llama-server names its headers `Content-Type` (not `content-type`): its recorded stream
    still goes out as a chunked body, one event a piece — not as one body with a length."""
    async with open_fake("llamacpp", models=(MODEL,)) as fake:
        fake.script(MODEL, replay(STREAM))
        async with httpx2.AsyncClient(trust_env=False) as http:
            body = {"model": MODEL, "messages": ASK, "stream": True}
            got = await http.post(f"{fake.base_url}/chat/completions", json=body)
    assert got.headers["transfer-encoding"] == "chunked" and "content-length" not in got.headers
    assert got.content == STREAM.partition(b"\n\n")[2]
