"""Any OpenAI-compatible endpoint. A remote endpoint is not assumed free: its default kind is `none`
until config says otherwise (`[lanes.free_tier] kind = "local"` for a self-hosted server)."""

from lanes import NoFreeTier, Provider

PROVIDER = Provider(
    name="openai_compatible",
    base_url="http://127.0.0.1:8000/v1",
    api_key_env="",
    free_tier=NoFreeTier(),
)
