"""A hostile review of the HTTP surface after issues 27 and 28: each finding kept as the test that
showed it (a strict xfail until it is fixed, then a guard of the fix). Everything runs against
`lanes.testing` fakes on loopback, or on the pure translations."""

from __future__ import annotations

import re

import pytest
import trio

from lanes._core.dialects import responses_api
from lanes._core.dialects.common import BadField
from lanes._core.model.job import MAX_DROPPED, bounded_names
from lanes.testing import answer
from lanes.testing.harness.clients import http_request
from lanes.testing.harness.configs import open_sidecar

OK = {"messages": [{"role": "user", "content": "Say the pangram."}]}

# == finding 1: naming what was dropped is quadratic in the names =================================


def test_naming_dropped_fields_is_linear_in_their_count():
    """A body of many unknown keys (a 4 MiB body holds ~350,000) is named as dropped in one pass:
    the names were deduplicated against a list, so 40,000 keys took 18 s of the event loop. Here
    100,000 names (and each twice) are named at once — the list's way would take minutes, so this
    test would hang, not pass; no time is asserted."""
    names = [f"k{i}" for i in range(100_000)]
    named = bounded_names(names + names)
    assert len(named) == MAX_DROPPED and named[-1] == f"+{100_000 - MAX_DROPPED + 1} more"
    assert named[: MAX_DROPPED - 1] == tuple(names[: MAX_DROPPED - 1])


# == finding 2: colliding namespaced tools grow their flat names one underscore at a time ==========


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


# == finding 3: a client that pipelines a second request and leaves is not noticed ===============


@pytest.mark.xfail(
    strict=True, reason="known limit (departures.py): a pipelined request hides the client's close"
)
async def test_a_client_that_pipelines_and_leaves_cancels_its_job(autojump_clock):
    """A client sends a 5 s chat job and, on the same connection, a second request (pipelining,
    which HTTP/1.1 allows), then closes: its upstream request is dropped within 0.1 s, as for a
    client that did not pipeline. h11 pauses the connection behind the first answer, so the close
    is never read and the job ran its full 5 s (a paid upstream bills it): any client defeats
    the departure rule with one extra request line (`departures.py` documents this)."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fake = fakes["local"]
        fake.script("local-model", answer(delay_s=5.0))
        stream = await trio.open_tcp_stream("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0]))
        first = http_request("POST", "/v1/chat/completions", OK)
        await stream.send_all(first + http_request("GET", "/health"))
        with trio.fail_after(1):
            await fake.wait_for(lambda f: f.in_flight)
        left_at = trio.current_time()
        await stream.aclose()
        with trio.fail_after(10):
            await fake.wait_for(lambda f: not f.in_flight)
    assert fake.departed, "the upstream answered in full: nothing let go of its request"
    assert fake.departed[-1].at - left_at < 0.1


# == finding 4: a flat name for a namespaced tool can pass the 64 characters chat allows ==========


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


# == finding 5: an input item whose `type` is not a string is a 500 =============================


@pytest.mark.parametrize("kind", [{}, ["message"], {"a": "b" * 100_000}])
def test_an_input_item_type_of_the_wrong_type_is_a_400_naming_it(kind):
    """`/v1/responses` with `input: [{"type": {}}]`: a 400 naming `input[0].type`, with the value
    shown at most briefly. It raised TypeError (a dict is no member of a set): a 500 from the
    sidecar, and a traceback in its log, for any client's malformed item."""
    with pytest.raises(BadField) as refused:
        responses_api.to_chat({"input": [{"type": kind}]})
    assert refused.value.param == "input[0].type"
    assert len(str(refused.value)) < 300
