"""Groq: a rate-limited free tier; its `x-ratelimit-*-requests` headers count per day and
`*-tokens` per minute. Defaults as of 2026-11."""

from lanes import Model, Provider, RateLimitedFree

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
