"""Google Gemini through its OpenAI-compatible endpoint: rate-limited free tier, no rate-limit
headers; a 429 body carries RetryInfo.retryDelay and a QuotaFailure naming PerMinute / PerDay.
Defaults as of 2026-11 (Flash; Pro has fewer requests per day)."""

from lanes import Model, Provider, RateLimitedFree

PROVIDER = Provider(
    name="gemini",
    base_url="https://generativelanguage.googleapis.com/v1beta/openai",
    api_key_env="GEMINI_API_KEY",
    free_tier=RateLimitedFree(rpm=10, rpd=250, tpm=250_000),
    catalog_style="prefixed_ids",
    models=(
        # its OpenAI-compatible endpoint maps reasoning_effort to the thinking budget
        Model(id="gemini-2.5-flash", context=1048576, max_output_tokens=65536, reasoning=True),
        Model(id="gemini-embedding-001", context=2048, embedding=True),
    ),
)
