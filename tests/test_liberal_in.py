"""Liberal in, exact out, pure: what the Responses and Messages translations drop (named, never
sent), what they translate (namespaced tools that round-trip, reasoning efforts, structured
output, system entries mid-conversation), on the bodies real clients sent."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes._core.dialects import messages_api, responses_api, responses_reply, responses_stream
from lanes._core.model.candidates import Candidate
from lanes._core.model.job import MAX_DROPPED, MAX_DROPPED_NAME, Job, bounded_names
from lanes._core.policy.spend import as_sent, worst_case
from lanes.testing.answers import chunks, completion

CLIENTS = Path(__file__).parent / "fixtures" / "clients"


def captured(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((CLIENTS / f"{name}.json").read_text())["body"]
    return body


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}


# -- the Responses API -----------------------------------------------------------------------------


def test_codexs_request_is_translated_and_what_is_dropped_is_named():
    """Codex's real request: client_metadata, include, store, the web_search tool … are named as
    dropped, and none of them reaches the chat request."""
    chat = responses_api.to_chat(captured("codex-0"))
    assert set(chat.dropped) >= {
        "client_metadata",
        "include",
        "store",
        "prompt_cache_key",
        "reasoning.summary",
        "tools.web_search",
    }
    assert set(chat.params) == {"tools", "tool_choice", "parallel_tool_calls"}
    names = [t["function"]["name"] for t in chat.params["tools"]]
    assert "spawn_agent" in names and "exec_command" in names and len(names) == len(set(names))
    assert chat.reasoning_effort is None


@pytest.mark.parametrize(
    "key", ["client_metadata", "context_management", "prompt_cache_options", "moderation"]
)
def test_fields_current_sdks_send_are_dropped_not_refused(key):
    """Each field an SDK may send that lanes does not carry is dropped by name, its value unsent."""
    chat = responses_api.to_chat({"input": "hi", key: {"secret": "value"}, "future_key": 1})
    assert chat.dropped == (key, "future_key")
    assert "value" not in json.dumps([chat.messages, chat.params])


def test_background_options_without_background_is_dropped():
    """background_options alone is dropped; background: true is still refused."""
    chat = responses_api.to_chat({"input": "hi", "background": False, "background_options": {}})
    assert chat.dropped == ("background_options",)


NAMESPACED = [
    function("search"),
    {"type": "namespace", "name": "mcp__docs__", "tools": [function("search"), function("open")]},
    {"type": "namespace", "name": "multi_agent_v1", "tools": [function("spawn_agent")]},
]


def test_namespaced_tools_get_flat_names_that_never_collide():
    """A namespace's members become functions: their own name when unique, else joined."""
    chat = responses_api.to_chat({"input": "hi", "tools": NAMESPACED})
    names = [t["function"]["name"] for t in chat.params["tools"]]
    assert names == ["search", "mcp__docs__search", "open", "spawn_agent"]


def called(flat_name: str) -> dict[str, Any]:
    request = {
        "messages": [{"role": "user", "content": "q"}],
        "tools": [{"type": "function", "function": {"name": flat_name, "parameters": {}}}],
    }
    return request


@pytest.mark.parametrize(
    ("flat", "namespace", "name"),
    [
        ("mcp__docs__search", "mcp__docs__", "search"),
        ("spawn_agent", "multi_agent_v1", "spawn_agent"),
        ("search", None, "search"),
    ],
)
def test_a_namespaced_call_comes_back_as_declared(flat, namespace, name):
    """The call a client gets back names its namespace and its own name, whole and streamed."""
    body = {"input": "hi", "tools": NAMESPACED}
    whole = responses_reply.response_of(
        body, completion(called(flat), "x", "m"), response_id="r", created_at=0
    )
    [item] = [i for i in whole["output"] if i["type"] == "function_call"]
    events = responses_stream.ResponseEvents(body, response_id="r", created_at=0, model="m")
    streamed = [e for c in chunks(called(flat), "x", "m") for e in events.feed(c)]
    streamed += events.finish()
    done = [e["item"] for e in streamed if e["type"] == "response.output_item.done"]
    added = [e["item"] for e in streamed if e["type"] == "response.output_item.added"]
    for call in (item, done[0], added[0]):
        assert call["name"] == name and call.get("namespace") == namespace


def test_a_namespaced_call_fed_back_goes_upstream_by_its_flat_name():
    """A function_call item with a namespace, fed back in input, reads the flat name again."""
    item = {
        "type": "function_call",
        "call_id": "c1",
        "namespace": "mcp__docs__",
        "name": "search",
        "arguments": "{}",
    }
    output = {"type": "function_call_output", "call_id": "c1", "output": "found"}
    user = {"role": "user", "content": "hi"}
    chat = responses_api.to_chat({"input": [user, item, output], "tools": NAMESPACED})
    assert chat.messages[1]["tool_calls"][0]["function"]["name"] == "mcp__docs__search"


def test_only_built_in_tools_leave_no_tools_and_no_tool_choice():
    """Dropped built-in tools leave no tools, and a tool_choice of auto goes with them."""
    chat = responses_api.to_chat(
        {"input": "hi", "tools": [{"type": "file_search"}], "tool_choice": "auto"}
    )
    assert "tools" not in chat.params and "tool_choice" not in chat.params
    assert chat.dropped == ("tools.file_search", "tool_choice")


@pytest.mark.parametrize(
    ("asked", "sent"),
    [("minimal", "low"), ("low", "low"), ("medium", "medium"), ("xhigh", "high"), ("x", None)],
)
def test_reasoning_effort_is_carried_as_one_of_three_levels(asked, sent):
    """reasoning.effort becomes the job's reasoning_effort (low/medium/high), never a param."""
    chat = responses_api.to_chat({"input": "hi", "reasoning": {"effort": asked}})
    assert chat.reasoning_effort == sent and "reasoning_effort" not in chat.params
    assert ("reasoning.effort" in chat.dropped) == (sent is None)


# -- the Messages API ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["claude-0", "claude-1", "claude-2"])
def test_claude_codes_requests_are_translated(name):
    """Claude Code's real requests: thinking, context_management … dropped by name; the effort
    carried; its user_id (a JSON object) not sent; a system entry stays where it was."""
    body = captured(name)
    chat = messages_api.to_chat(body)
    assert {"thinking", "context_management", "metadata.user_id"} <= set(chat.dropped)
    assert "user" not in chat.params and chat.params["max_tokens"] == body["max_tokens"]
    assert chat.reasoning_effort == ("high" if "output_config" in body else None)
    roles = [m["role"] for m in chat.messages]
    if body["messages"][-1]["role"] == "system":
        assert roles == ["system", "user", "system"]
        assert chat.messages[-1]["content"] == body["messages"][-1]["content"]


def test_a_system_entry_becomes_a_system_message_at_its_place():
    """A {"role": "system"} entry between turns is a system message between them."""
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "c"},
        ],
    }
    chat = messages_api.to_chat(body)
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "system", "user"]
    assert chat.messages[2]["content"] == "be brief"


def test_output_config_format_is_a_json_schema_response_format():
    """output_config.format (what messages.parse sends) is chat's response_format json_schema."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    chat = messages_api.to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "a"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}, "x": 1},
        }
    )
    assert chat.params["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }
    assert chat.dropped == ("output_config.x",)


def test_server_tools_not_forced_are_dropped_and_the_rest_kept():
    """A server tool is dropped by type; client tools, cache_control and the rest go on."""
    tool = {"name": "get", "input_schema": {"type": "object"}}
    chat = messages_api.to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "a"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}, tool],
            "tool_choice": {"type": "auto"},
            "cache_control": {"type": "ephemeral"},
            "inference_geo": "eu",
            "speed": "fast",
            "diagnostics": {},
            "container": "c",
            "mcp_servers": [],
        }
    )
    assert [t["function"]["name"] for t in chat.params["tools"]] == ["get"]
    assert chat.dropped == (
        "cache_control",
        "inference_geo",
        "speed",
        "diagnostics",
        "container",
        "tools.web_search_20250305",
    )


def test_a_plain_user_id_is_still_sent():
    """metadata.user_id that is a short plain identifier goes on as chat's user."""
    chat = messages_api.to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "a"}],
            "metadata": {"user_id": "user-42"},
        }
    )
    assert chat.params["user"] == "user-42" and chat.dropped == ()


# -- what is recorded ------------------------------------------------------------------------------


@given(st.lists(st.text(max_size=200), max_size=100))
def test_dropped_names_are_bounded(names):
    """At most 32 names, each at most 64 printable ASCII characters, each once, in order."""
    kept = bounded_names(names)
    assert len(kept) <= MAX_DROPPED and len(set(kept)) == len(kept)
    assert all(len(n) <= MAX_DROPPED_NAME and n.isascii() and n.isprintable() for n in kept)
    distinct = list(dict.fromkeys(bounded_names([n]) for n in names))
    if len(distinct) <= MAX_DROPPED:
        assert kept == tuple(n for (n,) in distinct)
    else:
        assert kept[-1] == f"+{len(distinct) - MAX_DROPPED + 1} more"


def test_a_job_bounds_what_it_is_given():
    """A Job made with many long names keeps them bounded (the Python API, too)."""
    job = Job(messages=[{"role": "user", "content": "x"}], dropped=["k" * 500] * 3 + ["\n"])
    assert job.dropped == ("k" * 61 + "...", "?")


# -- per candidate ---------------------------------------------------------------------------------


def candidate(*, reasoning: bool, tier: str = "free") -> Candidate:
    prices = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0} if tier == "paid" else {}
    return Candidate(lane="l", model="m", tier=tier, reasoning=reasoning, **prices)  # type: ignore[arg-type]


def test_a_translated_effort_goes_only_to_a_model_that_declares_reasoning():
    """reasoning_effort is sent to a `reasoning` model, and not to one that does not declare it;
    a chat request's own reasoning_effort passes through untouched either way."""
    job = Job(messages=[{"role": "user", "content": "x"}], reasoning_effort="high")
    sent = [
        as_sent(job, candidate(reasoning=r), paid_max_tokens=64, capped=False).body("m")
        for r in (True, False)
    ]
    assert sent[0]["reasoning_effort"] == "high" and "reasoning_effort" not in sent[1]
    chat = Job(messages=[{"role": "user", "content": "x"}], params={"reasoning_effort": "low"})
    plain = as_sent(chat, candidate(reasoning=False), paid_max_tokens=64, capped=False)
    assert plain.body("m")["reasoning_effort"] == "low"


def test_an_effort_leaves_a_paid_worst_case_as_it_was():
    """On a paid reasoning model the effort is sent and the worst case is the same figure: the
    reasoning it buys is output, within the one output cap."""
    paid = candidate(reasoning=True, tier="paid")
    plain = Job(messages=[{"role": "user", "content": "x"}])
    effort = attrs.evolve(plain, reasoning_effort="high")
    cases = [
        worst_case(paid, as_sent(j, paid, paid_max_tokens=64, capped=True)) for j in (plain, effort)
    ]
    sent = as_sent(effort, paid, paid_max_tokens=64, capped=True).body("m")
    assert sent["reasoning_effort"] == "high" and sent["max_tokens"] == 64
    extra = len(',"reasoning_effort":"high"')  # its bytes are input the worst case prices
    assert isinstance(cases[0], float) and isinstance(cases[1], float)
    assert cases[1] == pytest.approx(cases[0] + extra * 1.0 / 1e6)


def test_naming_dropped_fields_is_linear_in_their_count():
    """A body of many unknown keys (a 4 MiB body holds ~350,000) is named as dropped in one pass:
    the names were deduplicated against a list, so 40,000 keys took 18 s of the event loop. Here
    100,000 names (and each twice) are named at once — the list's way would take minutes, so this
    test would hang, not pass; no time is asserted."""
    names = [f"k{i}" for i in range(100_000)]
    named = bounded_names(names + names)
    assert len(named) == MAX_DROPPED and named[-1] == f"+{100_000 - MAX_DROPPED + 1} more"
    assert named[: MAX_DROPPED - 1] == tuple(names[: MAX_DROPPED - 1])


def test_colliding_namespaced_tools_get_short_distinct_flat_names():
    """1,000 namespace tools of one name, each with a member `x` (62 KB of body): every flat name
    stays short and distinct. Each collision added one `_` and tried again, so names grew to the
    count (1,003 characters, sent upstream) and the translation was cubic: 4,000 such tools
    (250 KB) held the event loop 20 s."""
    tools = [{"type": "namespace", "name": "n", "tools": [{"name": "x"}]} for _ in range(1_000)]
    chat = responses_api.to_chat({"input": "hi", "tools": tools})
    names = [t["function"]["name"] for t in chat.params["tools"]]
    assert len(set(names)) == len(names) == 1_000
    assert max(map(len, names)) <= len("n__x") + 6, max(map(len, names))


def test_a_namespaced_tools_flat_name_fits_chats_limit():
    """Two MCP servers of long names that both offer `search_documents_by_query`: each member's
    flat name (namespace joined to name) is at most 64 characters of `[A-Za-z0-9_-]`, the limit
    OpenAI's and Groq's chat APIs enforce on a function name — else every request with those
    tools is a 400 upstream, for a client that sent nothing wrong (the joined name was 65)."""
    servers = ["mcp__acme_corp_internal_knowledge_base__", "mcp__acme_corp_engineering_wiki__"]
    member = {"type": "function", "name": "search_documents_by_query", "parameters": {}}
    tools = [{"type": "namespace", "name": s, "tools": [member]} for s in servers]
    chat = responses_api.to_chat({"input": "hi", "tools": tools})
    names = [t["function"]["name"] for t in chat.params["tools"]]
    assert len(set(names)) == 2
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name), name
