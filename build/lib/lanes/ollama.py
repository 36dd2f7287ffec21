"""Ollama: owned local capacity on its OpenAI-compatible endpoint; always free, no key."""

from lanes import AlwaysFreeLocal, Model, Provider

PROVIDER = Provider(
    name="ollama",
    base_url="http://127.0.0.1:11434/v1",
    api_key_env="",
    free_tier=AlwaysFreeLocal(),
    models=(
        Model(id="llama3.2:3b", context=131_072),
        Model(id="nomic-embed-text", context=8192, embedding=True),
    ),
    prefill=True,
)
