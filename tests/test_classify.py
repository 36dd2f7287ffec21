"""Upstream answers classified into the exception tree: a table per status and body."""

from __future__ import annotations

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
from lanes._core.upstream.responses import check_completion, classify_status


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
