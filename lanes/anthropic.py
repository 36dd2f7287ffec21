"""Anthropic through its OpenAI-compatible endpoint: no free tier; anthropic-ratelimit-*
headers with RFC 3339 resets. Prices in USD per million tokens, 2026-11."""

from lanes import Model, NoFreeTier, Provider

PROVIDER = Provider(
    name="anthropic",
    base_url="https://api.anthropic.com/v1",
    api_key_env="ANTHROPIC_API_KEY",
    free_tier=NoFreeTier(),
    prefill=True,
    models=(
        Model(
            id="claude-haiku-4-5", context=200000, input_usd_per_mtok=1.0, output_usd_per_mtok=5.0
        ),
    ),
)
