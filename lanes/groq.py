"""Groq: a rate-limited free tier; its `x-ratelimit-*-requests` headers count per day and
`*-tokens` per minute. Defaults as of 2026-11.

Quirk: Groq refuses a property it does not know with a 400 ("property 'store' is unsupported"),
which ends a job. A conversation that Gemini served before carries Gemini's thought signatures on
its tool calls (`extra_content`): meaningful to Gemini only, they are taken out of what Groq is
sent."""

from typing import Any

from lanes import Job, Model, OpenAICompatibleLane, Provider, RateLimitedFree

PROVIDER = Provider(
    name="groq",
    base_url="https://api.groq.com/openai/v1",
    api_key_env="GROQ_API_KEY",
    free_tier=RateLimitedFree(rpm=30, rpd=14_400, tpm=6_000, tpd=500_000),
    conventions={"requests": 86_400.0, "tokens": 60.0},
    models=(
        Model(id="llama-3.1-8b-instant", context=131_072, max_output_tokens=131_072),
        Model(id="llama-3.3-70b-versatile", context=131_072, max_output_tokens=32_768),
    ),
)


class Lane(OpenAICompatibleLane):
    def adapt_request(self, body: dict[str, Any], job: Job) -> dict[str, Any]:
        for message in body.get("messages") or ():
            calls = message.get("tool_calls") if isinstance(message, dict) else None
            if isinstance(calls, list) and any(
                isinstance(c, dict) and "extra_content" in c for c in calls
            ):
                message["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "extra_content"}
                    if isinstance(c, dict)
                    else c
                    for c in calls
                ]
        return body
