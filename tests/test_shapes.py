"""What real providers send, read one way (pure): typed content parts, reasoning, usage wherever it
is put, errors inside a 200, tool-call deltas numbered where the provider left out their index."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lanes._core.upstream.shapes import (
    ToolIndexes,
    in_band_error,
    normal_chunk,
    normal_completion,
    reasoning_of,
    split_parts,
    usage_in,
)

THINKING = {"type": "thinking", "thinking": [{"type": "text", "text": "2+2 is 4."}]}


def test_typed_parts_become_text_and_reasoning_in_a_delta():
    """A delta whose content is a list of parts carries its text as the content string and its
    thinking as `reasoning_content`; the rest of the chunk is kept."""
    chunk = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": [THINKING]}}],
    }
    answer = {"choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": "4"}]}}]}
    assert normal_chunk(chunk) == {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": None, "reasoning_content": "2+2 is 4."},
            }
        ],
    }
    assert normal_chunk(answer) == {"choices": [{"index": 0, "delta": {"content": "4"}}]}


def test_a_whole_message_is_read_as_its_stream_is():
    """A message's list content is read by the same rule as a delta's: text, then reasoning."""
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": [THINKING, {"type": "text", "text": "2 + 2 = 4"}],
                },
            }
        ]
    }
    message = normal_completion(completion)["choices"][0]["message"]  # type: ignore[index]
    assert message == {
        "role": "assistant",
        "content": "2 + 2 = 4",
        "reasoning_content": "2+2 is 4.",
    }


def test_plain_chat_is_left_alone():
    """String content (or none) changes nothing: the caller keeps the upstream's own bytes."""
    assert normal_chunk({"choices": [{"delta": {"content": "hi"}}]}) is None
    assert normal_chunk({"choices": []}) is None
    assert normal_completion({"choices": [{"message": {"content": None}}]}) is None


parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
        st.fixed_dictionaries(
            {
                "type": st.just("thinking"),
                "thinking": st.lists(
                    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
                    max_size=3,
                ),
            }
        ),
        st.fixed_dictionaries({"type": st.sampled_from(["image_url", "reference"])}),
        st.integers(),
    ),
    max_size=6,
)


@given(parts)
def test_no_text_is_lost_or_invented(content):
    """Every text part's text is in the content, in order, and every thinking part's in the
    reasoning; parts that carry no text add nothing."""
    text, thinking = split_parts(content)
    texts = [p["text"] for p in content if isinstance(p, dict) and p["type"] == "text"]
    thoughts = [
        q["text"]
        for p in content
        if isinstance(p, dict) and p["type"] == "thinking"
        for q in p["thinking"]
    ]
    assert text == ("".join(texts) if texts else None)
    assert thinking == "".join(thoughts)


def test_reasoning_is_read_from_the_first_field_present():
    """`reasoning_content`, else `reasoning`, else `reasoning_details` — never two of them, as
    providers that send both send the same text twice."""
    both = {
        "reasoning": "Okay",
        "reasoning_details": [{"type": "reasoning.text", "text": "Okay"}],
    }
    assert reasoning_of(both) == "Okay"
    assert reasoning_of({"reasoning_content": "a", "reasoning": "b"}) == "a"
    details = [
        {"type": "reasoning.summary", "summary": "S."},
        {"type": "reasoning.encrypted", "data": "xyz"},
        {"type": "reasoning.text", "text": "T."},
    ]
    assert reasoning_of({"reasoning_details": details}) == "S.T."
    assert reasoning_of({"content": "x"}) == ""


def test_usage_is_found_where_the_provider_put_it():
    """Top-level usage first; else a vendor extension's (`x_<vendor>.usage`); empty or null usage
    is none."""
    vendor = {"x_vendor": {"id": "req", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}}
    assert usage_in(vendor) == {"prompt_tokens": 3, "completion_tokens": 2}
    assert usage_in({"usage": {"total_tokens": 9}, **vendor}) == {"total_tokens": 9}
    assert usage_in({"usage": None, "x_vendor": {"id": "req"}}) is None
    assert usage_in({"usage": {}}) is None


def test_an_error_inside_a_200_keeps_the_status_it_gave():
    """The status comes from `status_code`, or a numeric `code`; the code is the provider's own
    string, else the typed code it gives; an error naming no status is a gateway's 502."""
    said = {
        "error": {
            "message": "Tool call validation failed",
            "type": "invalid_request_error",
            "code": "tool_use_failed",
            "status_code": 400,
        }
    }
    assert in_band_error(said) == (
        400,
        {
            "error": {
                "message": "Tool call validation failed",
                "code": "tool_use_failed",
                "type": "invalid_request_error",
            }
        },
    )
    limited = {
        "error": {"code": 429, "message": "Rate limit exceeded", "metadata": {"error_type": "x"}},
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
    }
    assert in_band_error(limited) == (
        429,
        {"error": {"message": "Rate limit exceeded", "code": "x", "type": None}},
    )
    gone = in_band_error({"error": {"code": "server_error", "message": "gone"}})
    unsaid = in_band_error({"error": {"message": "?"}})
    assert gone is not None and unsaid is not None and gone[0] == unsaid[0] == 502
    assert in_band_error({"error": None, "choices": []}) is None
    assert in_band_error({"choices": []}) is None


@given(
    st.dictionaries(
        st.text(max_size=6),
        st.recursive(
            st.none() | st.integers() | st.text(),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=8,
        ),
        max_size=5,
    )
)
def test_the_readers_never_raise(body):
    """Whatever an upstream sends, the readers answer (or say None) and never raise."""
    normal_chunk(body)
    normal_completion(body)
    usage_in(body)
    in_band_error(body)
    reasoning_of(body)


def test_tool_indexes_keep_what_the_provider_numbered_and_number_the_rest():
    """ToolIndexes leaves a delta with its own index as it is (even a huge one, at no cost), and
    numbers indexless deltas by call: a new id or a named call is the next index, an id seen
    before its own index, a bare continuation the last call's."""
    indexes = ToolIndexes()

    def delta(*calls: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": list(calls)}}]}

    def numbers(chunk: dict[str, Any] | None) -> list[int]:
        assert chunk is not None
        return [c["index"] for c in chunk["choices"][0]["delta"]["tool_calls"]]

    assert indexes.indexed(delta({"index": 10**12, "id": "x"})) is None
    fresh = ToolIndexes()
    first = fresh.indexed(delta({"id": "a", "function": {"name": "f", "arguments": "{"}}))
    assert numbers(first) == [0]
    assert numbers(fresh.indexed(delta({"function": {"arguments": "}"}}))) == [0]
    both = delta({"id": "", "function": {"name": "g"}}, {"id": "b", "function": {"name": "h"}})
    assert numbers(fresh.indexed(both)) == [1, 2]
    assert numbers(fresh.indexed(delta({"id": "a", "function": {"arguments": " "}}))) == [0]
