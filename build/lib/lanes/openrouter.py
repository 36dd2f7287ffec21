"""OpenRouter: free models end in `:free` (20 a minute, 50 a day — 1,000 once 10 credits were
bought; account-wide, resetting at UTC midnight); X-RateLimit-Reset in epoch milliseconds;
`GET /key` reports the balance; a negative balance answers 402 even on free models. Defaults as of
2026-11.

Quirk: a job that needs zero data retention asks OpenRouter's router for it in the body.

Billing switches (OpenRouter's API reference, 2026-11): `models` and `route` let the router fall
back to other models — paid ones included — when the one asked for is busy; `plugins` add web
search (billed per result) or PDF parsing (OCR billed per page); `web_search_options` turns on
native web search (billed per request); `preset` applies a saved configuration that may hold any
of these. A `:free` model carries none of them; a paid one asking for them is refused. Provider
routing (`provider`) only chooses among the endpoints of the model asked for, so it stays.
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
    billing_switches=("models", "route", "plugins", "web_search_options", "preset"),
    models=(
        Model(id="meta-llama/llama-3.3-70b-instruct:free", context=131_072),
        Model(id="deepseek/deepseek-chat-v3-0324:free", context=163_840),
    ),
)


class Lane(OpenAICompatibleLane):
    def adapt_request(self, body: dict[str, Any], job: Job) -> dict[str, Any]:
        if job.privacy == "zdr":
            provider = dict(body.get("provider") or {})
            provider.update({"data_collection": "deny", "zdr": True, "allow_fallbacks": False})
            body["provider"] = provider
        return body
