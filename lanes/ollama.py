"""Ollama: owned local capacity on its OpenAI-compatible endpoint; always free, no key."""

from lanes._core.config import ModelConfig
from lanes._core.upstream.lane import Provider
from lanes.freetier.kinds import AlwaysFreeLocal

PROVIDER = Provider(
    name="ollama",
    base_url="http://127.0.0.1:11434/v1",
    api_key_env="",
    free_tier=AlwaysFreeLocal(),
    models=(ModelConfig(id="llama3.2:3b", context=131_072),),
    prefill=True,
)
