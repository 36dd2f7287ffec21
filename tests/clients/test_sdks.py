"""The SDKs people point at a gateway, unmodified, against `lanes serve --simulate`: the OpenAI
Agents SDK (over the Responses API and over chat completions), the Anthropic SDK (create, stream,
tools, messages.parse, count_tokens) and the OpenAI SDK's Responses helpers (parse, stream)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel

from lanes.testing import ANSWER

set_tracing_disabled(True)  # the SDK's traces would go to OpenAI's servers
UNTRACED = RunConfig(tracing_disabled=True)


class Weather(BaseModel):
    city: str
    degrees: int


called: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    called.append(city)
    return "sunny, 21 degrees"


def anthropic_client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="unused", max_retries=0)


@pytest.mark.parametrize("wire", ["responses", "chat"])
def test_agents_sdk_runs_a_tool_loop(simulated, wire):
    """An Agents SDK agent with a function tool: the tool is called, its result goes back, and
    the run ends with the final answer — over either wire API."""
    client = openai.AsyncOpenAI(base_url=simulated, api_key="unused", max_retries=0)
    model = (
        OpenAIResponsesModel("auto", openai_client=client)
        if wire == "responses"
        else OpenAIChatCompletionsModel("auto", openai_client=client)
    )
    called.clear()
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather], model=model)
    result = Runner.run_sync(
        agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True)
    )
    assert called, "the tool was never called"
    assert result.final_output == ANSWER


@pytest.mark.parametrize("wire", ["responses", "chat"])
def test_agents_sdk_structured_output(simulated, wire):
    """An agent with an output_type: the final output validates into the pydantic model."""
    client = openai.AsyncOpenAI(base_url=simulated, api_key="unused", max_retries=0)
    model = (
        OpenAIResponsesModel("auto", openai_client=client)
        if wire == "responses"
        else OpenAIChatCompletionsModel("auto", openai_client=client)
    )
    agent = Agent(name="w", instructions="Report.", output_type=Weather, model=model)
    result = Runner.run_sync(
        agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True)
    )
    assert isinstance(result.final_output, Weather)
    assert isinstance(result.final_output.degrees, int)


def test_anthropic_messages_parse_returns_the_model(simulated):
    """messages.parse(output_format=Model) sends output_config.format and gets the model back."""
    client = anthropic_client(simulated)
    parsed = client.messages.parse(
        model="claude-sonnet-4-6",
        max_tokens=512,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        output_format=Weather,
    )
    assert isinstance(parsed.parsed_output, Weather)


def test_anthropic_count_tokens(simulated):
    """count_tokens answers a positive estimate for a request with a tool."""
    client = anthropic_client(simulated)
    counted = client.messages.count_tokens(
        model="claude-haiku-4-5",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
    )
    assert counted.input_tokens > 0


def test_anthropic_stream_with_tools(simulated):
    """A streamed tool_use arrives whole through the SDK's stream helper, then the answer."""
    client = anthropic_client(simulated)
    tools: Any = [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    question: Any = {"role": "user", "content": "Weather in Paris?"}
    with client.messages.stream(
        model="claude-opus-4-8", max_tokens=512, messages=[question], tools=tools
    ) as stream:
        first = stream.get_final_message()
    [use] = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and isinstance(use.input["city"], str)
    with client.messages.stream(
        model="claude-opus-4-8",
        max_tokens=512,
        tools=tools,
        messages=[
            question,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and getattr(final.content[0], "text", None) == ANSWER


def test_openai_responses_parse_and_stream(simulated):
    """responses.parse with a pydantic text_format, and responses.stream's final response."""
    client = openai.OpenAI(base_url=simulated, api_key="unused", max_retries=0)
    parsed = client.responses.parse(model="auto", input="Weather in Paris?", text_format=Weather)
    assert isinstance(parsed.output_parsed, Weather)
    with client.responses.stream(model="auto", input="Say hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == ANSWER
