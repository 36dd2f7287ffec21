"""Upstream answers classified into the exception tree: a table per status and body."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes._core.model.errors import (
    ContextLengthExceeded,
    CreditExhausted,
    FinalError,
    ModelGone,
    RateLimited,
    RetryableError,
)
from lanes._core.model.untrusted import shown
from lanes._core.upstream.responses import check_completion, classify_status, error_fields

LOCAL = Path(__file__).parent / "corpus" / "local"
LOCAL_EXPECTED = json.loads((LOCAL / "expected.json").read_text())


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            429,
            {
                "error": {
                    "message": "Rate limit reached for requests",
                    "code": "rate_limit_exceeded",
                }
            },
            RateLimited,
        ),
        (
            429,
            {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}},
            CreditExhausted,
        ),
        (
            429,
            "Your team has run out of credits. Purchase more to continue.",
            CreditExhausted,
        ),  # xAI, plain text
        (
            429,
            [
                {
                    "error": {
                        "code": 429,
                        "message": "Quota exceeded for metric",
                        "status": "RESOURCE_EXHAUSTED",
                    }
                }
            ],
            RateLimited,
        ),  # Gemini wraps its error in a list
        (402, {"error": {"message": "Insufficient credits"}}, CreditExhausted),
        (
            404,
            {"error": {"message": "The model `x` does not exist", "code": "model_not_found"}},
            ModelGone,
        ),
        (400, {"error": {"message": "model_not_found: no such model"}}, ModelGone),
        (
            400,
            {"error": {"message": "This model's maximum context length is 8192 tokens"}},
            ContextLengthExceeded,
        ),
        (
            413,
            {"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"}},
            ContextLengthExceeded,
        ),
        (400, {"error": {"message": "Invalid value for 'temperature'"}}, FinalError),
        (
            400,
            {"error": {"message": "Flagged by content policy", "code": "content_policy_violation"}},
            FinalError,
        ),
        (401, {"error": {"message": "Invalid API key"}}, FinalError),
        (403, "forbidden", FinalError),
        (413, "Request Entity Too Large", FinalError),
        (422, {"detail": "unprocessable"}, FinalError),
        (408, "", RetryableError),
        (425, "", RetryableError),
        (500, "<html>oops</html>", RetryableError),
        (502, None, RetryableError),
        (503, {"error": {"message": "overloaded"}}, RetryableError),
        (409, {}, RetryableError),
    ],
)
def test_status_table(status, body, expected):
    """Each upstream answer lands in its class, with the status kept."""
    error = classify_status(status, {}, body)
    assert type(error) is expected
    assert error.status == status


def test_messages_are_scrubbed_of_keys():
    """An upstream that echoes our key never gets it into an error message."""
    key = "sk-live-abcdefghijklmnop1234"
    error = classify_status(
        401, {}, {"error": {"message": f"Incorrect API key provided: {key}"}}, secrets=[key]
    )
    assert key not in str(error) and "[redacted]" in str(error)
    assert "gsk_" not in shown("token gsk_abcdefghijklmnopqrstu here")
    assert shown("code rate_limit_exceeded_for_model") == "code rate_limit_exceeded_for_model"


@pytest.mark.parametrize(
    "body", [None, "text", [], {"choices": []}, {"choices": "x"}, {"error": {"message": "boom"}}]
)
def test_garbage_completions_are_retryable(body):
    """A 2xx that is not a usable completion is a retryable fault, not an answer."""
    with pytest.raises(RetryableError):
        check_completion(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@given(st.integers(100, 599), json_values)
def test_classification_is_total(status, body):
    """Any status and any JSON-ish body classify without raising."""
    assert classify_status(status, {}, body).status == status


@pytest.mark.parametrize("name", sorted(LOCAL_EXPECTED))
def test_local_servers_error_bodies(name):
    """Each local server's own error answer (tests/corpus/local) lands in its class with the code
    its words give: a context overflow of llama.cpp, Ollama, vLLM or LM Studio is
    `ContextLengthExceeded`; loading, busy and out of memory are retryable."""
    answer = json.loads((LOCAL / name).read_text())
    error = classify_status(answer["status"], {}, answer["body"])
    assert (type(error).__name__, error.code) == (
        LOCAL_EXPECTED[name]["class"],
        LOCAL_EXPECTED[name]["code"],
    )
    assert error.status == answer["status"]


def test_every_local_body_is_expected_and_sourced():
    """Each body of tests/corpus/local has its expected reading, its origin, and a line in
    SOURCES.md."""
    files = sorted(p.name for p in LOCAL.glob("*.json") if p.name != "expected.json")
    sources = (LOCAL / "SOURCES.md").read_text()
    assert files == sorted(LOCAL_EXPECTED)
    assert [f for f in files if f"`{f}`" not in sources] == []
    assert all(json.loads((LOCAL / f).read_text())["origin"] for f in files)


@pytest.mark.parametrize(
    "body",
    [
        {
            "error": {
                "code": 400,
                "message": "'temperature' must be <= 2",
                "type": "invalid_request_error",
            }
        },
        {"error": {"message": "Invalid value for 'max_tokens': must be a positive integer."}},
        {
            "error": {
                "message": "Incorrect API key provided",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        },
        {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
        {
            "error": {
                "message": "tools param requires --jinja flag",
                "type": "server_error",
                "code": 400,
            }
        },
        {"error": "json: cannot unmarshal string into Go struct field"},
    ],
)
def test_ordinary_final_400s_are_not_a_context_overflow(body):
    """A bad parameter or a refused key stays final: the overflow wordings match nothing else."""
    error = classify_status(400, {}, body)
    assert type(error) is FinalError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"code": 400, "type": "exceed_context_size_error"}, "exceed_context_size_error"),
        ({"code": 429, "status": "RESOURCE_EXHAUSTED"}, "RESOURCE_EXHAUSTED"),
        (
            {"code": "context_length_exceeded", "type": "invalid_request_error"},
            "context_length_exceeded",
        ),
        ({"code": "400", "type": "fake"}, "fake"),
        ({"code": None, "type": "api_error"}, "api_error"),
        ({"code": 503}, "503"),
        ({"code": True, "type": ""}, None),
        ({}, None),
    ],
)
def test_the_code_kept_is_a_word_before_a_number(error, code):
    """The code kept is the first text among code, type and status; a number only without one."""
    assert error_fields({"error": {"message": "m", **error}}) == ("m", code)


names = st.one_of(st.none(), st.integers(0, 999), st.booleans(), st.text(max_size=12))


@given(code=names, type_=names, status=names)
def test_a_word_always_wins_over_a_number(code, type_, status):
    """Whatever mix an error carries, a numeric code is kept only when no field has a word."""
    fields = {"code": code, "type": type_, "status": status}
    _, kept = error_fields({"error": fields})
    words = [v for v in fields.values() if isinstance(v, str) and v.strip() and not v.isdigit()]
    if words:
        assert kept == words[0]
    elif kept is not None:
        assert kept.isdigit()
