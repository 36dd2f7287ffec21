"""Agent frameworks nobody here wrote — LangChain and pydantic-ai — against a real
`lanes serve --simulate` process: tool calls and structured output validate, as they would
against a real provider."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest
from pydantic import BaseModel

from lanes.testing import ANSWER

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel

# LangChain and pydantic-ai are imported by the tests that use them, not when the suite is
# collected: two seconds of importing that every pytest-xdist worker (and `make test-quick`,
# which runs none of these) would pay.

pytestmark = pytest.mark.slow  # every test here asks a `lanes serve --simulate` process


class Joke(BaseModel):
    setup: str
    punchline: str
    rating: int


def weather_tool() -> Any:
    """A LangChain tool: the weather in a city."""
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    return get_weather


def chat_model(url: str) -> ChatOpenAI:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=url, api_key="unused", model="auto", max_retries=0)  # type: ignore[arg-type]


def test_langchain_bind_tools_round_trip(simulated):
    """bind_tools: a tool call LangChain parses; the tool's answer gets the final answer."""
    from langchain_core.messages import HumanMessage, ToolMessage

    get_weather = weather_tool()
    llm = chat_model(simulated).bind_tools([get_weather])
    question = HumanMessage("Weather in Paris?")
    asked = llm.invoke([question])
    [call] = asked.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = llm.invoke([question, asked, result])
    assert final.content == ANSWER and not final.tool_calls


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(simulated, method):
    """with_structured_output, by JSON schema or by function calling, validates into the model."""
    joke = chat_model(simulated).with_structured_output(Joke, method=method).invoke("A joke")
    assert isinstance(joke, Joke) and joke.setup == "setup"


def provider_model(url: str) -> OpenAIChatModel:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("auto", provider=OpenAIProvider(base_url=url, api_key="unused"))


def test_pydantic_ai_structured_output(simulated):
    """pydantic-ai's structured output (its output tool) validates into the model."""
    from pydantic_ai import Agent

    result = Agent(provider_model(simulated), output_type=Joke).run_sync("Tell me a joke")
    assert isinstance(result.output, Joke) and result.output.punchline == "punchline"


def test_pydantic_ai_calls_a_tool_then_answers(simulated):
    """A pydantic-ai agent with a tool: the tool is called, then the text answer arrives."""
    from pydantic_ai import Agent

    called = []
    agent = Agent(provider_model(simulated))

    @agent.tool_plain
    def lookup(topic: str) -> str:
        """Look a topic up."""
        called.append(topic)
        return "facts"

    result = agent.run_sync("What do you know?")
    assert called and result.output == ANSWER


def test_claude_names_and_embeddings_under_simulate(simulated):
    """The simulator answers Claude-style names (dated ones too) and its embedding model."""
    client = anthropic.Anthropic(base_url=simulated.removesuffix("/v1"), api_key="unused")
    message = client.messages.create(
        model="claude-haiku-4-5-20251001",
        max_tokens=100,
        messages=[{"role": "user", "content": "Say hi"}],
    )
    vectors = openai.OpenAI(base_url=simulated, api_key="unused").embeddings.create(
        model="nomic-embed-text", input=["a", "b"]
    )
    assert message.content[0].text == ANSWER  # type: ignore[union-attr]
    assert len(vectors.data) == 2
