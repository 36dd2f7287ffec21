"""Together AI: a few `-Free` models at about 3 requests a minute; x-ratelimit-* and
x-tokenlimit-* headers. As of 2026-11."""

from lanes import FreeModelsOnly, Model, Provider

PROVIDER = Provider(
    name="together",
    base_url="https://api.together.xyz/v1",
    api_key_env="TOGETHER_API_KEY",
    free_tier=FreeModelsOnly(patterns=("*-Free",), rpm=3),
    catalog_style="per_mtok_prices",
    models=(Model(id="meta-llama/Llama-3.3-70B-Instruct-Turbo-Free", context=131072),),
)
