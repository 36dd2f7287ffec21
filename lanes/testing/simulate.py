"""`lanes serve --simulate`: simulated providers on 127.0.0.1 and a config routed to them.

No keys, no network. Five providers, each failing the way its real counterpart does (and each
answering as `lanes.testing.answers` says: tool calls, JSON, embeddings — so an agent can be tried):
- `local`: an owned model that goes away for 20 s in every minute (connections refused);
- `groq`: a rate-limited free tier, 10 requests a minute, reporting OpenAI-style headers;
- `gemini`: 5 a minute, no headers — its 429 body carries RetryInfo and a per-minute QuotaFailure;
- `openrouter`: `:free` models (8 a minute, account-wide, epoch-ms resets) beside a paid one;
- `paid`: no free tier at all, behind the consent gate and a small daily ceiling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import trio

from lanes.testing import FakeProvider, answer, open_fake, quota

log = logging.getLogger("lanes.simulate")

SIM_KEYS = {
    "SIM_GROQ_KEY": "sim-groq-key",
    "SIM_GEMINI_KEY": "sim-gemini-key",
    "SIM_OPENROUTER_KEY": "sim-openrouter-key",
    "SIM_PAID_KEY": "sim-paid-key",
}


def _listed(
    model: str, context: int, price: tuple[str, str], params: str, inputs: str = "text"
) -> dict[str, Any]:
    """One model as OpenRouter lists it: prices per token as strings, parameters, modalities."""
    return {
        "id": model,
        "context_length": context,
        "pricing": {"prompt": price[0], "completion": price[1]},
        "supported_parameters": params.split(),
        "architecture": {"input_modalities": inputs.split()},
    }


# An OpenRouter-shaped model list. Discovery adds the free models the config does not name
# (mistral-7b:free) and leaves the paid ones out.
OPENROUTER_CATALOG = [
    _listed("llama-3.3-70b:free", 65536, ("0", "0"), "tools temperature"),
    _listed("qwen-coder:free", 32768, ("0", "0"), "temperature"),
    _listed("mistral-7b:free", 32768, ("0", "0"), "tools response_format"),
    _listed("claude-sim", 200000, ("0.000003", "0.000015"), "tools", "text image"),
    {"id": "gpt-unpriced", "context_length": 128000},
]


#: The simulator's embedding model, offered by the local lane and (the same model) by the
#: Groq-like free lane, so an embedding falls back to the same model and never another.
EMBEDDING_MODEL = "nomic-embed-text"
#: Claude-style names, for clients of the Messages API: each an alias over the simulated lanes (a
#: dated name such as claude-haiku-4-5-20251001 resolves to its alias).
CLAUDE_ALIASES = {
    "claude-sonnet-4-6": [
        "groq/llama-3.1-8b-instant",
        "openrouter/llama-3.3-70b:free",
        "gemini/gemini-flash",
        "paid/gpt-sim-mini",
    ],
    "claude-haiku-4-5": ["local/llama3.2:3b", "groq/llama-3.1-8b-instant", "gemini/gemini-flash"],
    "claude-opus-4-7": ["openrouter/llama-3.3-70b:free", "paid/gpt-sim-mini"],
}
#: Any other Claude-style name (claude-sonnet-5, claude-opus-4-8, claude-3-5-haiku-latest …) finds
#: its tier's alias by the first glob it matches.
CLAUDE_PATTERNS = {
    "claude-*haiku*": "claude-haiku-4-5",
    "claude-*sonnet*": "claude-sonnet-4-6",
    "claude-*opus*": "claude-opus-4-7",
    "claude-*": "claude-sonnet-4-6",
}

#: Gemini-style names (Gemini CLI asks for gemini-3.1-pro-preview, and gemini-3.5-flash-lite for
#: its own small questions) find an alias the same way; the simulated lane's own `gemini-flash`
#: is a model id, and so is served by that lane.
GEMINI_PATTERNS = {
    "gemini-*lite*": "claude-haiku-4-5",
    "gemini-*flash*": "claude-sonnet-4-6",
    "gemini-*pro*": "claude-sonnet-4-6",
}


def simulated_config(
    fakes: dict[str, FakeProvider],
    *,
    state: str = ":memory:",
    local_state: str = ":memory:",
    fallback: str = "ask",
) -> dict[str, Any]:
    """The TOML-shaped config for the simulated providers."""
    return {
        "default_deadline_s": 30,
        "state": state,
        "local_state": local_state,
        "policy": {
            "free_tier_fallback": fallback,
            "paid_ceiling_usd_per_day": 0.05,
            "approval_wait_s": 25,
            "classes": {"coding": ["openrouter/qwen-coder:free"]},
        },
        "aliases": {
            "fast": ["groq/llama-3.1-8b-instant", "gemini/gemini-flash", "paid/gpt-sim-mini"],
            **CLAUDE_ALIASES,
        },
        "alias_patterns": CLAUDE_PATTERNS | GEMINI_PATTERNS,
        "lanes": [
            {
                "name": "local",
                "module": "ollama",
                "base_url": fakes["local"].base_url,
                "models": [
                    {"id": "llama3.2:3b", "context": 8192},
                    {"id": EMBEDDING_MODEL, "context": 8192, "embedding": True},
                ],
                "breaker": {"failures": 2, "cooldown_s": 5},
            },
            {
                "name": "groq",
                "module": "openai_compatible",
                "base_url": fakes["groq"].base_url,
                "api_key_env": "SIM_GROQ_KEY",
                "free_tier": {"kind": "rate_limited", "rpm": 10},
                "models": [
                    {"id": "llama-3.1-8b-instant", "context": 131072, "tools": True},
                    {"id": EMBEDDING_MODEL, "context": 8192, "embedding": True},
                ],
            },
            {
                "name": "gemini",
                "module": "openai_compatible",
                "base_url": fakes["gemini"].base_url,
                "api_key_env": "SIM_GEMINI_KEY",
                "free_tier": {"kind": "rate_limited", "rpm": 5},
                "models": [
                    {"id": "gemini-flash", "context": 1048576, "vision": True, "reasoning": True}
                ],
            },
            {
                "name": "openrouter",
                "module": "openrouter",
                "base_url": fakes["openrouter"].base_url,
                "api_key_env": "SIM_OPENROUTER_KEY",
                "free_tier": {"kind": "free_models", "rpm": 8},
                "discover": True,
                "models": [
                    {"id": "llama-3.3-70b:free", "context": 65536},
                    {"id": "qwen-coder:free", "context": 32768},
                    {
                        "id": "claude-sim",
                        "context": 200000,
                        "input_usd_per_mtok": 3,
                        "output_usd_per_mtok": 15,
                    },
                ],
            },
            {
                "name": "paid",
                "module": "openai_compatible",
                "base_url": fakes["paid"].base_url,
                "api_key_env": "SIM_PAID_KEY",
                "free_tier": {"kind": "none"},
                "models": [
                    {
                        "id": "gpt-sim-mini",
                        "context": 1047576,
                        "input_usd_per_mtok": 0.4,
                        "output_usd_per_mtok": 1.6,
                        "prefill": True,
                    }
                ],
            },
        ],
    }


async def _flap(fake: FakeProvider, up_s: float = 40.0, down_s: float = 20.0) -> None:
    while True:
        await trio.sleep(up_s)
        await fake.refuse()
        await trio.sleep(down_s)
        await fake.listen()


@attrs.frozen(kw_only=True)
class Simulation:
    """The simulated providers, running; the TOML-shaped config that names them; the environment
    with their keys."""

    fakes: dict[str, FakeProvider]
    config: dict[str, Any]
    env: dict[str, str]


@asynccontextmanager
async def open_simulation(
    env: Mapping[str, str],
    *,
    state: str = ":memory:",
    local_state: str = ":memory:",
    fallback: str = "ask",
    flap: bool = True,
) -> AsyncIterator[Simulation]:
    """`lanes serve --simulate`, `--workers` with it, and `open_dispatcher(simulate=True)`: the
    simulated providers started, their config (state as given) and `env` with their keys."""
    async with _open_fakes(flap=flap) as fakes:
        log.warning(
            "simulated providers on 127.0.0.1: %s",
            ", ".join(f"{n}={f.port}" for n, f in fakes.items()),
        )
        data = simulated_config(fakes, state=state, local_state=local_state, fallback=fallback)
        yield Simulation(fakes=fakes, config=data, env={**SIM_KEYS, **env})


@asynccontextmanager
async def _open_fakes(*, flap: bool) -> AsyncIterator[dict[str, FakeProvider]]:
    """Start the simulated providers; yield them by lane name."""
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        fakes = {}
        for name in ("local", "groq", "gemini", "openrouter", "paid"):
            epoch = time.time()  # wall-clock: the fakes' headers carry epoch resets
            catalog = OPENROUTER_CATALOG if name == "openrouter" else None
            fakes[name] = await stack.enter_async_context(
                open_fake(name, catalog=catalog, wall_offset=epoch - trio.current_time())
            )
        fakes["local"].script("llama3.2:3b", answer(delay_s=0.05))
        fakes["groq"].script("llama-3.1-8b-instant", quota(10, style="openai"))
        fakes["local"].script(EMBEDDING_MODEL, answer())
        fakes["groq"].script(EMBEDDING_MODEL, quota(10, style="openai"))
        fakes["gemini"].script("gemini-flash", quota(5, style="gemini"))
        for model in ("llama-3.3-70b:free", "qwen-coder:free", "mistral-7b:free"):
            fakes["openrouter"].script(model, quota(8, style="openrouter"))
        fakes["openrouter"].script("claude-sim", answer())
        fakes["paid"].script("gpt-sim-mini", answer())
        if flap:
            nursery.start_soon(_flap, fakes["local"])
        yield fakes
        nursery.cancel_scope.cancel()
