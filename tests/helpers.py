"""Builders for configs that point at fake providers."""

from __future__ import annotations

from typing import Any

from lanes import Config, load_config

PAID_KEY = "sk-test-paid-0123456789abcdef"
FREE_KEY = "gsk_test_free_0123456789abcdef"


def lane(name: str, url: str, models: list[str], *, kind: str, module: str = "openai_compatible",
         key_env: str = "", **extra: Any) -> dict[str, Any]:
    """One `[[lanes]]` table for a fake provider."""
    free_tier: dict[str, Any] = {"kind": kind}
    model_tables = [{"id": m} for m in models]
    if kind == "none":
        model_tables = [{"id": m, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0} for m in models]
    return {"name": name, "module": module, "base_url": url, "api_key_env": key_env,
            "free_tier": free_tier, "models": model_tables, **extra}


def free_lane(name: str, url: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return lane(name, url, models or ["free-model"], kind="rate_limited", key_env="FREE_API_KEY", **extra)


def local_lane(name: str, url: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return lane(name, url, models or ["local-model"], kind="local", **extra)


def paid_lane(name: str, url: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return lane(name, url, models or ["paid-model"], kind="none", key_env="PAID_API_KEY", **extra)


# The engine's tests exercise fallback itself, so they allow paid fallback under a roomy ceiling;
# the policy's tests set `policy` explicitly.
ENGINE_POLICY = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 100.0}


def config(*lanes: dict[str, Any], **top: Any) -> Config:
    top.setdefault("policy", ENGINE_POLICY)
    return load_config({"lanes": list(lanes), **top}, env={})
