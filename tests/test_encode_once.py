"""An upstream body is encoded once per job, lane, model and stream switch — a same-candidate
retry sends the very bytes again — and a plain request (strict JSON with no float) is written by
the quick encoder byte for byte as `json.dumps` writes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanes
from helpers import config, examples, local_lane
from lanes._core.model.errors import FinalError
from lanes._core.upstream import lane as lane_module
from lanes._core.upstream.client import encode
from lanes.testing import answer, open_fake, status

TEXT = st.text(max_size=12)
NO_FLOATS = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=examples(300))
@given(st.dictionaries(TEXT, NO_FLOATS, max_size=6))
def test_a_plain_body_is_written_as_json_dumps_writes_it(body):
    """Any body without a float: the quick encoder's bytes are `json.dumps`'s, compact, UTF-8."""
    slow = json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    assert encode(body, plain=True) == encode(body) == slow.encode()


def test_what_json_can_not_carry_is_refused():
    """NaN is refused (400: no other lane is tried), and a lone surrogate either way; a plain
    body is strict JSON's, which holds no NaN."""
    for body, plain in (
        ({"t": float("nan")}, False),
        ({"t": "\ud800"}, False),
        ({"t": "\ud800"}, True),
    ):
        with pytest.raises(FinalError) as refused:
            encode(body, plain=plain)
        assert refused.value.status == 400


async def test_a_retry_sends_the_bytes_encoded_for_the_first_try(env, autojump_clock, monkeypatch):
    """A 500 retried on the same model: two requests upstream, one encoding, the same body."""
    encoded: list[dict[str, Any]] = []

    def counted(body: dict[str, Any], *, plain: bool = False) -> bytes:
        encoded.append(body)
        return encode(body, plain=plain)

    monkeypatch.setattr(lane_module, "encode", counted)
    async with open_fake("local", models=("local-model",)) as fake:
        fake.script("local-model", status(500), answer())
        conf = config(local_lane("local", fake.base_url))
        async with lanes.open_dispatcher(conf, env=env) as dispatcher:
            reply = await dispatcher.complete(
                lanes.Job(messages=[{"role": "user", "content": "Say the pangram."}])
            )
    assert [a.outcome for a in reply.attempts] == ["fault", "ok"]
    first, second = (r.body for r in fake.requests())
    assert len(encoded) == 1 and first == second == encoded[0]
