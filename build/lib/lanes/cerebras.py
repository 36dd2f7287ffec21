"""Cerebras: a rate-limited free tier; headers carry -minute / -hour / -day suffixes and resets as
float seconds; a 429 may carry only retry-after. Defaults as of 2026-11."""

from lanes import Model, Provider, RateLimitedFree

PROVIDER = Provider(
    name="cerebras",
    base_url="https://api.cerebras.ai/v1",
    api_key_env="CEREBRAS_API_KEY",
    free_tier=RateLimitedFree(rpm=30, rpd=14_400, tpm=60_000, tpd=1_000_000),
    models=(
        Model(id="llama3.1-8b", context=8192),
        Model(id="llama-3.3-70b", context=65536),
    ),
)
