"""A job's request is encoded once for its size and once for its digest, for it and the copies
`attrs.evolve` makes of it, and never gives a figure of other messages or tools than its own."""

from __future__ import annotations

import hashlib
import json

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes import Job

TEXT = st.text(max_size=30)
MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT}),
    min_size=1,
    max_size=4,
)
TOOLS = st.none() | st.lists(st.fixed_dictionaries({"type": st.just("function"), "x": TEXT}))


def expected_size(job: Job) -> int:
    what = job.request() if job.input is not None else [list(job.messages), job.params.get("tools")]
    return len(json.dumps(what, ensure_ascii=False, default=str).encode())


def expected_digest(job: Job) -> tuple[str, int]:
    raw = json.dumps(job.request(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest(), len(raw.encode())


@settings(max_examples=examples(100))
@given(MESSAGES, TOOLS, st.lists(st.tuples(st.sampled_from("mtp"), MESSAGES, TOOLS), max_size=6))
def test_every_copy_answers_for_its_own_request(messages, tools, edits):
    """Down a chain of copies — new messages, new tools, or only another parameter — each job's
    size and digest are those of its own request, asked in any order."""
    params = {} if tools is None else {"tools": tools}
    jobs = [Job(messages=messages, params=params)]
    for kind, new_messages, new_tools in edits:
        last = jobs[-1]
        if kind == "m":
            jobs.append(attrs.evolve(last, messages=new_messages))
        elif kind == "t":
            jobs.append(attrs.evolve(last, params={**last.params, "tools": new_tools}))
        else:
            jobs.append(attrs.evolve(last, params={**last.params, "temperature": 0}))
    for job in [*jobs, *reversed(jobs)]:
        assert job.input_bytes() == expected_size(job)
        assert job.fingerprint() == expected_digest(job)


def test_copies_share_what_was_worked_out():
    """A copy with only another parameter (a candidate's shaped request) shares the figures its
    original worked out; one with other messages works out its own."""
    job = Job(messages=[{"role": "user", "content": "x" * 1000}], params={"tools": []})
    size = job.input_bytes()
    capped = attrs.evolve(job, params={**job.params, "max_tokens": 5})
    assert capped.memo is job.memo and capped.input_bytes() == size
    longer = attrs.evolve(job, messages=[*job.messages, {"role": "user", "content": "y"}])
    assert longer.input_bytes() == expected_size(longer) > size
    assert job.input_bytes() == size  # the original again, after its copy was worked out


def test_an_embedding_is_its_input_alone():
    job = Job(input=["one", "two"], model="e")
    assert job.input_bytes() == len(b'["one", "two"]')
    assert job.fingerprint() == expected_digest(job)
