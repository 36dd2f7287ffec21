"""xAI: one-time signup credits (about $25, no reset); credit exhaustion arrives as a 429 with a
plain-text body. As of 2026-11."""

from lanes import CreditBased, Model, Provider

PROVIDER = Provider(
    name="xai",
    base_url="https://api.x.ai/v1",
    api_key_env="XAI_API_KEY",
    free_tier=CreditBased(budget_usd=25.0, reset="never"),
    models=(
        Model(id="grok-3-mini", context=131072, input_usd_per_mtok=0.3, output_usd_per_mtok=0.5),
    ),
)
