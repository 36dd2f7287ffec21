"""Google's clients of Gemini's API, unmodified, against `lanes serve --simulate`: the google-genai
Python SDK (`http_options` base_url: generate, stream, a function-calling round trip, countTokens,
the model list, an error it can read) and Gemini CLI (`GOOGLE_GEMINI_BASE_URL`: `gemini -p` runs a
tool and finishes the turn, streamed)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from lanes.testing import ANSWER
from realclients import clean_env, events, npm_client

genai = pytest.importorskip("google.genai", reason="google-genai: make test-clients installs it")
types = pytest.importorskip("google.genai.types")

# The simulator's free models serve these clients: with FREE_LANE=off each would, rightly, wait
# for paid consent (a 429 approval_required) instead.
pytestmark = pytest.mark.free_lane


def client(base: str, api_version: str | None = "v1beta") -> Any:
    """google-genai pointed at the sidecar (`api_version` None: the SDK's own default, `v1`)."""
    options: dict[str, Any] = {
        "base_url": base.removesuffix("/v1"),
        "retry_options": {"attempts": 1},
    }
    if api_version:
        options["api_version"] = api_version
    return genai.Client(api_key="unused", http_options=types.HttpOptions(**options))


@pytest.mark.parametrize("api_version", ["v1beta", None], ids=["v1beta", "sdk-default"])
def test_genai_generates_and_streams(simulated, api_version):
    """generate_content and generate_content_stream: the answer, usage, a STOP finish — on
    v1beta and on the SDK's default version."""
    sdk = client(simulated, api_version)
    said = sdk.models.generate_content(
        model="gemini-2.5-flash",
        contents="Say hi",
        config=types.GenerateContentConfig(
            system_instruction="Be brief.",
            temperature=0.2,
            max_output_tokens=200,
            safety_settings=[
                types.SafetySetting(
                    category="HARM_CATEGORY_HATE_SPEECH", threshold="BLOCK_ONLY_HIGH"
                )
            ],
            thinking_config=types.ThinkingConfig(thinking_budget=0),
        ),
    )
    pieces = list(sdk.models.generate_content_stream(model="gemini-2.5-flash", contents="Say hi"))
    assert said.text == ANSWER
    assert said.candidates[0].finish_reason == types.FinishReason.STOP
    assert said.usage_metadata.total_token_count > 0
    assert len(pieces) > 2 and "".join(p.text or "" for p in pieces) == ANSWER
    assert pieces[-1].candidates[0].finish_reason == types.FinishReason.STOP


def test_genai_runs_a_function_calling_round_trip(simulated):
    """Automatic function calling: the SDK calls the Python function the model asked for, sends
    its result back, and the answer follows; a chat does the same by hand, streamed."""
    called: list[str] = []

    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return "sunny, 21 degrees"

    sdk = client(simulated)
    said = sdk.models.generate_content(
        model="gemini-2.5-flash",
        contents="Weather in Paris?",
        config=types.GenerateContentConfig(tools=[get_weather]),
    )
    assert called and said.text == ANSWER
    history = said.automatic_function_calling_history
    assert [c.role for c in history] == ["user", "model", "user"]
    call, response = history[1].parts[0].function_call, history[2].parts[0].function_response
    # the SDK sends its function's result back without the call's id: lanes answers the call of
    # that name that is still open
    assert call.name == "get_weather" and call.id and response.name == call.name

    config = types.GenerateContentConfig(
        tools=[get_weather],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    chat = sdk.chats.create(model="gemini-2.5-flash", config=config)
    streamed = list(chat.send_message_stream("Weather in Oslo?"))
    [asked] = [
        p.function_call for s in streamed for p in s.candidates[0].content.parts if p.function_call
    ]
    result = types.Part.from_function_response(name=asked.name, response={"output": "snow"})
    result.function_response.id = asked.id
    final = chat.send_message(result)
    assert final.text == ANSWER


def test_genai_counts_lists_and_reads_an_error(simulated):
    """count_tokens estimates, models.list (on v1beta and the SDK's default v1) and models.get
    describe the sidecar's models, and a malformed request is a ClientError whose status and
    message name the field."""
    sdk = client(simulated)
    counted = sdk.models.count_tokens(model="gemini-2.5-flash", contents="Say hi")
    names = [m.name for m in sdk.models.list(config={"page_size": 5})]
    one = sdk.models.get(model="gemini-flash")
    default = client(simulated, api_version=None)  # kept: its pager asks for more pages
    on_v1 = [m.name for m in default.models.list()]
    with pytest.raises(genai.errors.ClientError) as refused:
        sdk.models.generate_content(
            model="gemini-2.5-flash",
            contents=[
                types.Content(
                    role="user",
                    parts=[types.Part.from_bytes(data=b"%PDF", mime_type="application/pdf")],
                )
            ],
        )
    assert counted.total_tokens > 0
    assert names[0] == "models/auto" and len(names) > 5  # the pager followed nextPageToken
    assert on_v1 == names  # the SDK's default version: GET /v1/models, answered as Gemini's
    assert one.name == "models/gemini/gemini-flash" and one.input_token_limit
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
    assert "inlineData.mimeType" in refused.value.message


def run_gemini(base: str, tmp_path) -> subprocess.CompletedProcess[str]:
    """`gemini -p` in a directory with one file, its own HOME, streaming JSON events. Its settings
    choose the API-key method: with `GOOGLE_GEMINI_BASE_URL` set and no choice saved, Gemini CLI
    0.61.0 guesses its `gateway` method, which its non-interactive mode then refuses ("Invalid
    auth method selected")."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    settings = tmp_path / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
    env = clean_env(
        tmp_path,
        GOOGLE_GEMINI_BASE_URL=base.removesuffix("/v1"),
        GEMINI_API_KEY="unused",
        GEMINI_CLI_TRUST_WORKSPACE="true",
    )
    command = [str(npm_client("gemini")), "-p", "list the files here", "-o", "stream-json"]
    return subprocess.run(
        command,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def test_gemini_cli_finishes_a_tool_round_trip(simulated, tmp_path):
    """gemini -p: the model's function call is run by Gemini CLI, its result goes back, the
    streamed answer follows, and gemini exits 0 with a successful result."""
    done = run_gemini(simulated, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = events(done.stdout)
    uses = [e for e in seen if e.get("type") == "tool_use"]
    results = [e for e in seen if e.get("type") == "tool_result"]
    assert uses and results, [e.get("type") for e in seen]
    assert {r["tool_id"] for r in results} & {u["tool_id"] for u in uses}
    assert all(r["status"] == "success" for r in results)
    deltas = [e["content"] for e in seen if e.get("type") == "message" and e.get("delta")]
    assert "".join(deltas) == ANSWER
    [final] = [e for e in seen if e.get("type") == "result"]
    assert final["status"] == "success" and final["stats"]["tool_calls"] >= 1
