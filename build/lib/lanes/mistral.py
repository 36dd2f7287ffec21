"""Mistral: about one request a second, 500k tokens a minute and 1B a month on the free tier;
x-ratelimit-*-tokens-{minute,month} and -req-minute headers, no retry-after on 429. As of
2026-11."""

from lanes import Model, Provider, RateLimitedFree

PROVIDER = Provider(
    name="mistral",
    base_url="https://api.mistral.ai/v1",
    api_key_env="MISTRAL_API_KEY",
    free_tier=RateLimitedFree(rpm=60, tpm=500_000, tpmonth=1_000_000_000),
    models=(
        Model(id="mistral-small-latest", context=131072),
        Model(id="mistral-embed", context=8192, embedding=True),
    ),
)
