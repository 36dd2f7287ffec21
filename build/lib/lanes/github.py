"""GitHub Models: low tier 15 requests a minute and 150 a day (high tier 10 / 50);
x-ratelimit-type and x-ratelimit-renewalperiod-requests headers. As of 2026-11."""

from lanes import Model, Provider, RateLimitedFree

PROVIDER = Provider(
    name="github",
    base_url="https://models.github.ai/inference",
    api_key_env="GITHUB_TOKEN",
    free_tier=RateLimitedFree(rpm=15, rpd=150),
    models=(Model(id="openai/gpt-4.1-mini", context=1047576),),
)
