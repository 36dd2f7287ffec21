"""Cohere through its compatibility API: a trial key allows 20 calls a minute and 1,000 a month;
no limit headers on 429, so local counting matters here. As of 2026-11."""

from lanes import Model, Provider, RateLimitedFree

PROVIDER = Provider(
    name="cohere",
    base_url="https://api.cohere.ai/compatibility/v1",
    api_key_env="COHERE_API_KEY",
    free_tier=RateLimitedFree(rpm=20, rpmonth=1_000),
    models=(Model(id="command-r7b-12-2024", context=128000),),
)
