"""Anthropic through its OpenAI-compatible endpoint: no free tier; anthropic-ratelimit-*
headers with RFC 3339 resets. Prices in USD per million tokens, 2026-11.

A request with tools is billed for a tool-use system prompt Anthropic adds itself: 346 input tokens
with `tool_choice` auto or none, 313 with any or a named tool (its tool-use documentation, for
every current model; retired Claude 3 Opus added 530 — raise `tool_prompt_tokens` in config for
a model that adds more)."""

from lanes import Model, NoFreeTier, Provider

PROVIDER = Provider(
    name="anthropic",
    base_url="https://api.anthropic.com/v1",
    api_key_env="ANTHROPIC_API_KEY",
    free_tier=NoFreeTier(),
    prefill=True,
    tool_prompt_tokens=346,
    models=(
        Model(
            id="claude-haiku-4-5",
            context=200000,
            max_output_tokens=64000,
            input_usd_per_mtok=1.0,
            output_usd_per_mtok=5.0,
        ),
    ),
)
