"""OpenRouter: free models end in `:free` (20 a minute, 50 a day — 1,000 once 10 credits were
bought; account-wide, resetting at UTC midnight); X-RateLimit-Reset in epoch milliseconds;
`GET /key` reports the balance; a negative balance answers 402 even on free models. Defaults as of
2026-11.

Quirk: a job that needs zero data retention asks OpenRouter's router for it in the body.
"""

from typing import Any

from lanes import CustomEndpoint, FreeModelsOnly, Job, Model, OpenAICompatibleLane, Provider

PROVIDER = Provider(
    name="openrouter",
    base_url="https://openrouter.ai/api/v1",
    api_key_env="OPENROUTER_API_KEY",
    free_tier=FreeModelsOnly(patterns=("*:free",), rpm=20, rpd=50, account_wide=True),
    balance=CustomEndpoint(url="{base_url}/key", json_path="data.limit_remaining"),
    catalog_style="per_token_prices",
    models=(
        Model(id="meta-llama/llama-3.3-70b-instruct:free", context=131_072),
        Model(id="deepseek/deepseek-chat-v3-0324:free", context=163_840),
    ),
)


class Lane(OpenAICompatibleLane):
    def request_body(self, job: Job, model: str, *, stream: bool) -> dict[str, Any]:
        body = super().request_body(job, model, stream=stream)
        if job.privacy == "zdr":
            provider = dict(body.get("provider") or {})
            provider.update({"data_collection": "deny", "zdr": True, "allow_fallbacks": False})
            body["provider"] = provider
        return body
