"""OpenAI: no free tier; every model is paid (prices in USD per million tokens, 2026-11)."""

from lanes import Model, NoFreeTier, Provider

PROVIDER = Provider(
    name="openai",
    base_url="https://api.openai.com/v1",
    api_key_env="OPENAI_API_KEY",
    free_tier=NoFreeTier(),
    output_cap="max_completion_tokens",  # its reasoning models refuse max_tokens
    models=(
        Model(
            id="gpt-4.1-mini",
            context=1_047_576,
            max_output_tokens=32_768,
            input_usd_per_mtok=0.40,
            output_usd_per_mtok=1.60,
        ),
        Model(id="text-embedding-3-small", context=8191, input_usd_per_mtok=0.02, embedding=True),
    ),
)
