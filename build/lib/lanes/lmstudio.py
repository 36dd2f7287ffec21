"""LM Studio: owned local capacity on its OpenAI-compatible endpoint; always free, no key."""

from lanes import AlwaysFreeLocal, Provider

PROVIDER = Provider(
    name="lmstudio",
    base_url="http://127.0.0.1:1234/v1",
    api_key_env="",
    free_tier=AlwaysFreeLocal(),
    prefill=True,
    models=(),
)
