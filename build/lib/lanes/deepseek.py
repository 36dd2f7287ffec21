"""DeepSeek: no free tier (cheap, paid); no rate-limit headers; keeps queued connections alive
with blank lines and SSE comments. Prices in USD per million tokens, 2026-11."""

from lanes import Model, NoFreeTier, Provider

PROVIDER = Provider(
    name="deepseek",
    base_url="https://api.deepseek.com/v1",
    api_key_env="DEEPSEEK_API_KEY",
    free_tier=NoFreeTier(),
    prefill=True,
    models=(
        Model(
            id="deepseek-chat",
            context=65536,
            max_output_tokens=8192,
            input_usd_per_mtok=0.27,
            output_usd_per_mtok=1.1,
        ),
    ),
)
