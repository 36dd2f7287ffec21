"""The requests real clients sent (tests/fixtures/clients: `codex exec` 0.171.0, `claude -p`
2.1.197), replayed byte for byte through a real `lanes serve --simulate` process: each is served
(200) with a tool call the client can run, the next turn gets the answer, and what lanes dropped
is in the request's story. And the Anthropic SDK's `messages.parse` gets its parsed model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from pydantic import BaseModel

from lanes.testing import ANSWER

# These clients are served on the simulator's free models: with FREE_LANE=off each would, rightly,
# wait for paid consent instead (a 429 approval_required, as the free-lane tests show elsewhere).
# Each asks a `lanes serve --simulate` process: slow.
pytestmark = [pytest.mark.free_lane, pytest.mark.slow]
CLIENTS = Path(__file__).parent / "fixtures" / "clients"
#: Headers the clients sent that are about this sidecar's own connection, not the request.
_HOP = {"host", "content-length", "connection", "accept-encoding"}


def capture(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((CLIENTS / f"{name}.json").read_text())
    return found


def replay(base: str, name: str, body: dict[str, Any] | None = None) -> httpx2.Response:
    """POST a captured request (its path, headers and body; `body` instead, when given)."""
    sent = capture(name)
    headers = {k: v for k, v in sent["headers"].items() if k.lower() not in _HOP}
    return httpx2.post(
        base + sent["path"],
        content=json.dumps(body if body is not None else sent["body"]).encode(),
        headers=headers,
        timeout=30,
    )


def events(reply: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON events of a server-sent-event stream."""
    lines = reply.text.splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def story(base: str, request_id: str) -> dict[str, Any]:
    """GET /v1/requests/{id}, once the sidecar's state sync has written it (within a second)."""
    give_up = time.monotonic() + 15  # wall-clock: another process writes it
    while True:
        answer = httpx2.get(f"{base}/v1/requests/{request_id}", timeout=5)
        if answer.status_code == 200 or time.monotonic() > give_up:
            assert answer.status_code == 200, answer.text
            found: dict[str, Any] = answer.json()
            return found
        time.sleep(0.1)


@pytest.fixture(scope="module")
def base(simulated: str) -> str:
    return simulated.removesuffix("/v1")


# -- Codex: the Responses API ----------------------------------------------------------------------


def test_codexs_first_request_gets_a_tool_call(base):
    """Codex's request, streamed as it asked: 200, a function call of its first tool whose count
    arguments are integers, response.completed; the story names what was dropped."""
    reply = replay(base, "codex-0")
    assert reply.status_code == 200, reply.text
    sent = events(reply)
    [call] = [e["item"] for e in sent if e["type"] == "response.output_item.done"]
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    assert "namespace" not in call
    assert isinstance(json.loads(call["arguments"])["yield_time_ms"], int)
    assert sent[-1]["type"] == "response.completed"
    told = story(base, reply.headers["x-lanes-request-id"])
    assert told["outcome"] == "ok"
    assert {"client_metadata", "include", "tools.web_search"} <= set(told["dropped"])


@pytest.mark.parametrize("stream", [True, False])
def test_a_namespaced_tool_call_comes_back_as_codex_declared_it(base, stream):
    """Forced onto a namespaced tool, the call comes back as {namespace, name}, whole and
    streamed — what Codex routes by."""
    body = capture("codex-0")["body"]
    body = {
        **body,
        "stream": stream,
        "tool_choice": {"type": "function", "namespace": "multi_agent_v1", "name": "spawn_agent"},
    }
    reply = replay(base, "codex-0", body)
    assert reply.status_code == 200, reply.text
    if stream:
        [call] = [e["item"] for e in events(reply) if e["type"] == "response.output_item.done"]
    else:
        [call] = [i for i in reply.json()["output"] if i["type"] == "function_call"]
    assert (call["namespace"], call["name"]) == ("multi_agent_v1", "spawn_agent")


def test_codexs_next_turn_gets_the_answer(base):
    """The call and its output fed back (namespace and all): the final text answer."""
    body = capture("codex-0")["body"]
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "namespace": "multi_agent_v1",
        "name": "spawn_agent",
        "arguments": "{}",
    }
    output = {"type": "function_call_output", "call_id": "call_1", "output": "spawned"}
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}
    turn = {**body, "input": [*body["input"], reasoning, call, output]}
    reply = replay(base, "codex-0", turn)
    assert reply.status_code == 200, reply.text
    done = [e for e in events(reply) if e["type"] == "response.completed"]
    assert done[0]["response"]["output"][0]["content"][0]["text"] == ANSWER


# -- Claude Code: the Messages API -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["claude-0", "claude-1", "claude-2"])
def test_claude_codes_request_gets_a_tool_use(base, name):
    """Claude Code's request (default, sonnet and haiku models; 64,000 or 32,000 max_tokens; its
    system entry, thinking, effort, cache hints): 200, a tool_use of its first tool, the model
    named as asked; the story names what was dropped."""
    reply = replay(base, name)
    assert reply.status_code == 200, reply.text
    sent = events(reply)
    [block] = [e["content_block"] for e in sent if e["type"] == "content_block_start"]
    assert block["type"] == "tool_use" and block["name"] == "Agent"
    assert sent[0]["message"]["model"] == capture(name)["body"]["model"]
    assert [e["delta"]["stop_reason"] for e in sent if e["type"] == "message_delta"] == ["tool_use"]
    told = story(base, reply.headers["x-lanes-request-id"])
    assert {"thinking", "context_management", "metadata.user_id"} <= set(told["dropped"])


def test_claude_codes_next_turn_gets_the_answer(base):
    """The tool_use and its tool_result fed back: end_turn with the text answer."""
    body = capture("claude-1")["body"]
    use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
    thinking = {"type": "thinking", "thinking": "", "signature": "sig"}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}
    turn = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": [thinking, use]},
            {"role": "user", "content": [result]},
        ],
    }
    reply = replay(base, "claude-1", turn)
    assert reply.status_code == 200, reply.text
    sent = events(reply)
    text = "".join(e["delta"].get("text", "") for e in sent if e["type"] == "content_block_delta")
    assert text == ANSWER
    assert [e["delta"]["stop_reason"] for e in sent if e["type"] == "message_delta"] == ["end_turn"]


class Forecast(BaseModel):
    city: str
    days: int
    celsius: list[float]


def test_the_anthropic_sdks_messages_parse_returns_the_model(base):
    """messages.parse(output_format=Model): output_config.format becomes a JSON-schema answer the
    SDK validates into the model."""
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    message = client.messages.parse(
        model="claude-sonnet-5",
        max_tokens=1024,
        messages=[{"role": "user", "content": "The forecast for Paris"}],
        output_format=Forecast,
        output_config={"effort": "medium"},
    )
    assert isinstance(message.parsed_output, Forecast)
    assert isinstance(message.parsed_output.days, int)
