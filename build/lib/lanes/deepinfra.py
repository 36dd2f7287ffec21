"""DeepInfra: about $5 of credits a month; no rate-limit headers known. As of 2026-11."""

from lanes import CreditBased, Model, Provider

PROVIDER = Provider(
    name="deepinfra",
    base_url="https://api.deepinfra.com/v1/openai",
    api_key_env="DEEPINFRA_API_KEY",
    free_tier=CreditBased(budget_usd=5.0, reset="monthly"),
    models=(
        Model(
            id="meta-llama/Meta-Llama-3.1-8B-Instruct",
            context=131072,
            input_usd_per_mtok=0.03,
            output_usd_per_mtok=0.05,
        ),
    ),
)
